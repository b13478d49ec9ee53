"""A machine other than the main one, in a training over several (`tuneline train-node CONFIG --machine-rank N`).

It needs no flow: from the same config it computes the same cache keys, waits until the main machine's entries are
complete, and launches its rank of the same training. pipeline_cache_dir, output_dir and the model and data files
must be on storage every machine reads at the same path."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tuneline.config import RunConfig, dump_config
from tuneline.content.step_cache import entry_dir, read_reference
from tuneline.errors import UserError
from tuneline.identity import keys
from tuneline.pipeline.launch import launch_command, run_streaming
from tuneline.runtime.contract import RUN_FILE, training_complete

DATASET_STEP, REFERENCE_STEP = "build-dataset", "build-reference-model"  # the folders tasks/ caches them in
POLL_S = 2.0


def training_inputs(config: RunConfig) -> dict[str, tuple[Path, str]]:
    """What the main machine's flow builds before it trains: step name -> (entry folder, key)."""
    from tuneline.reference import needs_reference

    cache = config.pipeline.pipeline_cache_dir
    dataset_fp = keys.dataset_key(config)
    inputs = {DATASET_STEP: (Path(config.data.tokenized_path or entry_dir(cache, DATASET_STEP, dataset_fp)),
                             dataset_fp)}
    if needs_reference(config):
        reference_fp = keys.reference_key(config, dataset_fp)
        inputs[REFERENCE_STEP] = (entry_dir(cache, REFERENCE_STEP, reference_fp), reference_fp)
    return inputs


def wait_for_inputs(inputs: dict[str, tuple[Path, str]], timeout_s: float,
                    on_line: Callable[[str], None] = print) -> None:
    """Until every entry is complete with its key; a UserError naming the missing ones after timeout_s."""
    deadline, said = time.monotonic() + timeout_s, False
    while True:
        missing = {step: folder for step, (folder, key) in inputs.items()
                   if (read_reference(folder) or {}).get("fingerprint") != key}
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise UserError(f"waited {timeout_s:.0f}s for the main machine's flow to build "
                            + ", ".join(f"'{step}' in {folder}" for step, folder in missing.items())
                            + ": start `tuneline train CONFIG` on the main machine (machine_rank 0) with the same "
                            "config and overrides, and give every machine the same pipeline_cache_dir on shared "
                            "storage (or a longer --wait)")
        if not said:
            on_line(f"waiting for the main machine's flow to build {', '.join(missing)} ...")
            said = True
        time.sleep(POLL_S)


def train_on_node(config: RunConfig, timeout_s: float, on_line: Callable[[str], None] = print) -> bool:
    """Join the main machine's training as machine_rank; False when that training had already finished."""
    pipe = config.pipeline
    if pipe.num_machines < 2 or pipe.machine_rank < 1:
        raise UserError(f"`train-node` starts a machine other than the main one: it needs 'num_machines' above 1 and "
                        f"a machine rank from 1 to num_machines - 1 (got num_machines {pipe.num_machines}, "
                        f"machine_rank {pipe.machine_rank}); the main machine runs `tuneline train`")
    inputs = training_inputs(config)
    wait_for_inputs(inputs, timeout_s, on_line)
    dataset_fp = inputs[DATASET_STEP][1]
    reference_fp = inputs[REFERENCE_STEP][1] if REFERENCE_STEP in inputs else keys.reference_key(config, dataset_fp)
    if training_complete(config.output_dir, keys.train_key(config, dataset_fp, reference_fp)):
        on_line(f"the training of this config has finished already ({config.output_dir / RUN_FILE}); "
                "nothing to join")
        return False
    trains_on = inputs.get(REFERENCE_STEP, inputs[DATASET_STEP])[0]  # the reference step's copy holds ref log-probs
    env = dict(os.environ)
    env.pop("MLFLOW_RUN_ID", None)  # only the main machine's process 0 logs, into the flow's run
    if config.model.hf_hub_token:
        env["HF_TOKEN"] = config.model.hf_hub_token
    with tempfile.TemporaryDirectory(prefix="tuneline-node-") as scratch:
        # this machine's copy of the resolved config: the main machine writes its own into output_dir
        config_path = dump_config(config.without_secrets(), Path(scratch) / "tuneline_config.yaml")
        cmd = launch_command(config, config_path, str(trains_on), other_machine=True)
        on_line(f"machine {pipe.machine_rank} of {pipe.num_machines}: joining {pipe.main_process_ip}")
        run_streaming(cmd, env, on_line)
    return True
