"""DeepSpeed from a `deepspeed` key naming a ds_config JSON (LLaMA-Factory's examples/deepspeed/ work as they are).

transformers reads the JSON in the child; tuneline owns the launch (`accelerate launch --use_deepspeed`, which sets the
rank variables DeepSpeed reads even for one process; on CPU with ACCELERATE_USE_CPU unset, else accelerate drops
DeepSpeed silently) and, on CPU, the child's process group: ZeRO-3's `zero.Init` counts processes through DeepSpeed's
own comm, which accelerate starts only on GPUs, so `share_process_group` starts it on accelerate's group."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

ZERO_STAGES = (0, 1, 2, 3)
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
INSTALL_HINT = "`pip install deepspeed` (the project's install includes it)"


def deepspeed_problems(value: Any) -> list[str]:
    """Why the `deepspeed` key's config cannot run here, each naming the key and file; empty when it can."""
    if not value:
        return []
    key = f"'deepspeed: {value}'"
    ds_config, problem = read_ds_config(value)
    if problem:
        return [f"{key} {problem}"]
    problems = [f"{key} {p}" for p in zero_problems(ds_config)]
    if problems:
        return problems
    if importlib.util.find_spec("deepspeed") is None:
        return [f"{key} needs the deepspeed package, which is not installed: {INSTALL_HINT}, or remove 'deepspeed'"]
    problem = accelerator_problem_here() or nvme_problem(ds_config)
    return [f"{key} {problem}"] if problem else []


def read_ds_config(value: Any) -> tuple[dict, str | None]:
    """The ds_config as a dict (transformers reads it as strict JSON), or why it cannot be read."""
    if isinstance(value, dict):
        return value, None
    path = Path(str(value)).expanduser()
    if not path.is_file():
        return {}, (f"names a file that does not exist (a relative path is read from the folder the run starts in, "
                    f"{Path.cwd()}); name a ds_config JSON such as examples/deepspeed/ds_z2_config.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return {}, f"is not a readable JSON file: {exc}"
    if not isinstance(data, dict):
        return {}, f"must hold a JSON object of DeepSpeed settings, not {type(data).__name__}"
    return data, None


def zero_problems(ds_config: dict) -> list[str]:
    zero = ds_config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        return [f"has 'zero_optimization: {zero!r}'; it must be an object with a 'stage'"]
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        return [f"has ZeRO 'stage: {stage!r}'; DeepSpeed runs stage 0, 1, 2 or 3"]
    problems = []
    for part in ("offload_optimizer", "offload_param"):
        offload = zero.get(part) or {}
        device = offload.get("device", "none") if isinstance(offload, dict) else None
        if device not in OFFLOAD_DEVICES:
            problems.append(f"has '{part}: {offload!r}'; it must be an object whose 'device' is one of "
                            f"{', '.join(OFFLOAD_DEVICES)}")
    return problems


def nvme_problem(ds_config: dict) -> str | None:
    """Offloading to NVMe goes through DeepSpeed's async_io op, which builds only where libaio is installed."""
    zero = ds_config.get("zero_optimization", {})
    if not any((zero.get(part) or {}).get("device") == "nvme" for part in ("offload_optimizer", "offload_param")):
        return None
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("AsyncIOBuilder")
    if builder is None or not builder.is_compatible():
        return ("offloads to 'nvme', which needs DeepSpeed's async_io op, and it cannot be built here (it needs "
                "libaio: `apt-get install libaio-dev`); offload to 'cpu' instead")
    return None


def accelerator_problem_here() -> str | None:
    """Whether DeepSpeed imports and picks an accelerator here (it falls back to CPU when it finds no GPU)."""
    try:
        from deepspeed.accelerator import get_accelerator

        get_accelerator()
    except Exception as exc:  # ImportError, or DeepSpeed's own ValueError for an accelerator it cannot use
        return f"needs DeepSpeed to set up its accelerator, and it cannot here: {type(exc).__name__}: {exc}"
    return None


def launch_environment(use_cpu: bool) -> list[str]:
    """`env` arguments before `accelerate launch --use_deepspeed` (see the module docstring)."""
    return ["env", "-u", "ACCELERATE_USE_CPU", "DS_ACCELERATOR=cpu"] if use_cpu else []


def share_process_group(training: dict) -> None:
    """In the training child, once accelerate has made the process group: give it to DeepSpeed's comm too."""
    if not training.get("deepspeed"):
        return
    import torch.distributed

    if not torch.distributed.is_initialized():
        return
    import deepspeed

    if not deepspeed.comm.is_initialized():
        deepspeed.init_distributed(dist_backend=torch.distributed.get_backend(), auto_mpi_discovery=False)
