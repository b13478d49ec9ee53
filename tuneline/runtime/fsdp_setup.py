"""FSDP, asked for by an accelerate config file (`accelerate_config` whose `distributed_type` is FSDP, as in
LLaMA-Factory's examples/accelerate/fsdp_config*.yaml) or by transformers' own `fsdp` key: where it can run.

accelerate shards a training with FSDP only across GPUs (or other accelerators): its AcceleratorState turns the FSDP
plugin on for its multi-accelerator kinds of distribution alone, and runs CPU processes as MULTI_CPU, where the
plugin is dropped without a word and the processes train plain data parallel (an FSDP config at 2 CPU processes
saves DDP checkpoints: optimizer.pt, nothing sharded). torch's own FSDP2 does run on CPU over gloo, but transformers'
Trainer trains through accelerate, so on CPU tuneline refuses FSDP rather than run DDP under its name, and names
DeepSpeed ZeRO, which does shard on CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

FSDP = "FSDP"  # accelerate's distributed_type for it


def read_accelerate_file(path: str | None) -> dict[str, Any]:
    """An accelerate config file's settings; empty when there is none or it cannot be read (the launch says why)."""
    try:
        data = yaml.safe_load(Path(path).read_text()) if path else None
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def fsdp_source(training: dict[str, Any], accelerate_config: str | None) -> str | None:
    """The key that asks for FSDP, as the user wrote it; None when nothing does."""
    if training.get("fsdp"):
        return f"'fsdp: {training['fsdp']}'"
    if str(read_accelerate_file(accelerate_config).get("distributed_type", "")).upper() == FSDP:
        return f"'accelerate_config: {accelerate_config}' (distributed_type: FSDP)"
    return None


def fsdp_problem(training: dict[str, Any], accelerate_config: str | None, gpus: bool) -> str | None:
    """Why FSDP cannot run where the training runs (`gpus`: whether its processes get GPUs), or None."""
    source = None if gpus else fsdp_source(training, accelerate_config)
    if source is None:
        return None
    return (f"{source} shards the model with FSDP, which accelerate sets up across GPUs only, and this training runs "
            "on CPU, where its processes would train plain data parallel with nothing sharded: train on GPUs (on Ray: "
            "'resources_per_worker: {GPU: 1}'), or on CPU shard with DeepSpeed ZeRO instead ('deepspeed: "
            "examples/deepspeed/ds_z3_config.json') and remove it")
