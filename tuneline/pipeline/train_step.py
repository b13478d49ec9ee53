"""The train step, from the flow's side: launch `accelerate launch -m tuneline.train` and follow it.

The parent writes the resolved config into output_dir, launches the child with the MLflow run in its
environment (the child logs its own step metrics there), forwards its lines and its progress, and marks the
output complete only after a clean exit. A killed parent leaves no marker, so the next start launches again and
the child resumes from its checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuneline.config import RunConfig, dump_config
from tuneline.pipeline.follow_log import TrainerLogReader
from tuneline.pipeline.launch import TrainingFailed, launch_command, run_streaming
from tuneline.training_contract import ERROR_PREFIX, LOG_FILE, TRAIN_KEY_ENV

COMPLETE_MARKER = "TRAIN_COMPLETE.json"
RESOLVED_CONFIG = "tuneline_config.yaml"


def training_complete(output_dir: str | Path, key: str) -> bool:
    """True when output_dir holds a finished training for exactly this key."""
    marker = Path(output_dir) / COMPLETE_MARKER
    try:
        return json.loads(marker.read_text()).get("train_key") == key
    except (OSError, json.JSONDecodeError):
        return False


# How a crashed training shows in its launcher's last lines: a process killed by a signal (accelerate's launcher,
# torch's elastic agent), or out of memory.
CRASH_SIGNS = re.compile(r"died with <Signals\.|exitcode\s*:\s*-\d|Signal \d+ \(SIG|out of memory|OutOfMemoryError")


def worth_retrying(error: BaseException) -> bool:
    """Only a crash (a signal: out of memory, a lost machine, a stop) may pass on a retry. An error in the config,
    the data or the code fails the same way again, so it is not retried."""
    if not isinstance(error, TrainingFailed) or ERROR_PREFIX in str(error):
        return False
    return error.returncode < 0 or any(CRASH_SIGNS.search(line) for line in error.tail)


def start_over(output_dir: Path) -> None:
    """`refresh_cache` means train again from step 0: drop this output_dir's checkpoints and results."""
    from tuneline.train.output_dir import OutputDirLock

    if not output_dir.is_dir():
        return
    lock = OutputDirLock(output_dir)  # a trainer still running there makes this fail with its holder named
    try:
        for entry in output_dir.iterdir():
            if entry.name.startswith(".tuneline.lock"):
                continue
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    finally:
        lock.release()


def training_input(dataset_ref: dict, reference_ref: dict | None) -> str:
    """The dataset the child trains on: the reference step's copy (with ref log-probs) when it made one."""
    if reference_ref and reference_ref.get("needed") and reference_ref.get("path"):
        return reference_ref["path"]
    return dataset_ref["path"]


def train_model(config: RunConfig, dataset_ref: dict, reference_ref: dict | None, key: str,
                mlflow_run_id: str | None, tracking_uri: str | None,
                on_line: Callable[[str], None] = print,
                on_progress: Callable[[dict], None] | None = None, start_fresh: bool = False) -> dict[str, Any]:
    """Train (or resume) into config.output_dir; return a small reference to the result.

    Each output line of the child goes to `on_line`; `on_progress` gets the newest trainer_log.jsonl entry at most
    every follow_log.INTERVAL_S. `start_fresh` (a forced rerun, first attempt only: a retry must resume) trains
    again from step 0.
    """
    output_dir = config.output_dir
    if start_fresh:
        start_over(output_dir)
    elif training_complete(output_dir, key):  # finished before, e.g. the orchestrator lost its record
        return json.loads((output_dir / COMPLETE_MARKER).read_text())
    output_dir.mkdir(parents=True, exist_ok=True)
    # credentials stay out of the resolved config, which the run logs to MLflow; the child never publishes, and
    # reads a gated model's token from the environment, where huggingface_hub looks for it
    config_path = dump_config(config.without_secrets(), output_dir / RESOLVED_CONFIG)
    cmd = launch_command(config, config_path, training_input(dataset_ref, reference_ref))
    env = {**os.environ, TRAIN_KEY_ENV: key}
    if config.model.hf_hub_token:
        env["HF_TOKEN"] = config.model.hf_hub_token
    if mlflow_run_id:
        env.update({"MLFLOW_RUN_ID": mlflow_run_id, "MLFLOW_TRACKING_URI": str(tracking_uri)})
    progress = TrainerLogReader(output_dir / LOG_FILE, skip_existing=True)  # before the child can touch it

    def forward(line: str) -> None:
        on_line(line)
        entries = progress.due()
        if on_progress and entries:
            on_progress(entries[-1])

    run_streaming(cmd, env, forward)
    ref = {"output_dir": str(output_dir), "train_key": key, "metrics": _read_metrics(output_dir),
           "mlflow_run_id": mlflow_run_id}
    _write_json(output_dir / COMPLETE_MARKER, ref)
    return ref


def _write_json(path: Path, data: dict) -> None:
    """Whole or absent: a later run never reads half a marker."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


def _read_metrics(output_dir: Path) -> dict[str, float]:
    for name in ("all_results.json", "train_results.json"):
        path = output_dir / name
        if path.is_file():
            data = json.loads(path.read_text())
            return {k: v for k, v in data.items() if isinstance(v, (int, float))}
    return {}
