"""Run training as a subprocess (`accelerate launch -m tuneline.train`) that resumes itself.

The parent writes the resolved config into output_dir, launches the child with the MLflow run in its
environment, forwards its lines and progress, and marks the output complete only after a clean exit. A
killed parent leaves no marker, so the next start launches again and the child resumes from its checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuneline.config import RunConfig, dump_config
from tuneline.errors import UserError

COMPLETE_MARKER = "TRAIN_COMPLETE.json"
RESOLVED_CONFIG = "tuneline_config.yaml"
TRAINER_LOG = "trainer_log.jsonl"
PROGRESS_INTERVAL_S = 5.0


def training_complete(output_dir: str | Path, key: str) -> bool:
    """True when output_dir holds a finished training for exactly this key."""
    marker = Path(output_dir) / COMPLETE_MARKER
    try:
        return json.loads(marker.read_text()).get("train_key") == key
    except (OSError, json.JSONDecodeError):
        return False


def worth_retrying(error: BaseException) -> bool:
    """A crash (killed, out of memory, a lost device) may pass on a retry; an error the user must fix will not."""
    from tuneline.train.__main__ import ERROR_PREFIX
    from tuneline.train.launch import TrainingFailed

    if isinstance(error, UserError) and not isinstance(error, TrainingFailed):
        return False
    return ERROR_PREFIX not in str(error)  # the child printed a user error: the same config fails the same way


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


class ProgressReader:
    """Follows trainer_log.jsonl as the child appends to it: new entries since the last call, or the newest one.

    `due()` hands on the newest entry at most every `interval_s`: each report is an API call (a Prefect artifact
    update, a database write on its server) taking CPU from training; one per logging step cost ~1% of a CPU run.
    """

    def __init__(self, path: Path, interval_s: float = PROGRESS_INTERVAL_S, clock: Callable[[], float] = time.monotonic):
        self.path, self.offset = path, 0
        self.interval_s, self.clock = interval_s, clock
        self.reported_at: float | None = None

    def due(self) -> dict[str, Any] | None:
        """The newest entry, if the last report is `interval_s` old and the log grew since; else None."""
        now = self.clock()
        if self.reported_at is not None and now - self.reported_at < self.interval_s:
            return None
        entries = self.new_entries()
        if not entries:
            return None
        self.reported_at = now
        return entries[-1]

    def new_entries(self) -> list[dict[str, Any]]:
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        if size < self.offset:  # a fresh run replaced the file
            self.offset = 0
        if size == self.offset:
            return []
        with open(self.path, encoding="utf-8") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        complete, _, _ = chunk.rpartition("\n")
        self.offset += len(complete.encode("utf-8")) + (1 if complete else 0)
        entries = []
        for line in complete.splitlines():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return entries


def train_model(config: RunConfig, dataset_ref: dict, reference_ref: dict | None, key: str,
                mlflow_run_id: str | None, tracking_uri: str | None,
                on_line: Callable[[str], None] = print,
                on_progress: Callable[[dict], None] | None = None, start_fresh: bool = False) -> dict[str, Any]:
    """Train (or resume) into config.output_dir; return a small reference to the result.

    Each output line of the child goes to `on_line`; `on_progress` gets the newest trainer_log.jsonl entry at
    most every PROGRESS_INTERVAL_S. `start_fresh` (a forced rerun, first attempt only: a retry must resume) trains again from step 0.
    """
    from tuneline.train.launch import launch_command, run_streaming

    output_dir = config.output_dir
    if start_fresh:
        start_over(output_dir)
    elif training_complete(output_dir, key):  # finished before, e.g. the orchestrator lost its record
        return json.loads((output_dir / COMPLETE_MARKER).read_text())
    output_dir.mkdir(parents=True, exist_ok=True)
    config_path = dump_config(config, output_dir / RESOLVED_CONFIG)
    cmd = launch_command(config, config_path, training_input(dataset_ref, reference_ref))
    env = {**os.environ, "TUNELINE_TRAIN_KEY": key, "PYTHONUNBUFFERED": "1"}
    if mlflow_run_id:
        env.update(MLFLOW_RUN_ID=mlflow_run_id, MLFLOW_TRACKING_URI=str(tracking_uri))
    reader = ProgressReader(output_dir / TRAINER_LOG)

    def forward(line: str) -> None:
        on_line(line)
        if on_progress and (entry := reader.due()) is not None:
            on_progress(entry)

    warm = _import_while_child_boots(config)
    try:
        run_streaming(cmd, env, forward)
    finally:
        warm.join()  # no thread of ours outlives the step
    metrics = _read_metrics(output_dir)
    ref = {"output_dir": str(output_dir), "train_key": key, "metrics": metrics, "mlflow_run_id": mlflow_run_id}
    tmp = output_dir / f".{COMPLETE_MARKER}.tmp"
    tmp.write_text(json.dumps(ref, default=str))
    os.replace(tmp, output_dir / COMPLETE_MARKER)
    return ref


def _import_while_child_boots(config: RunConfig) -> threading.Thread:
    """Import here what the evaluation and plots after training import, while the child starts.

    The child's start is mostly single-threaded imports, so on another core this costs training little and
    takes most of the tuned model's evaluation time (~5 s of ~6 s on the demo) off the run.
    """
    from tuneline.evaluation.run import import_libraries

    def run() -> None:
        try:
            import_libraries(config)
            import matplotlib.backends.backend_agg  # noqa: F401 - what the plot step draws with
        except Exception:  # noqa: BLE001 - the step that needs them imports them again and reports any error
            return

    thread = threading.Thread(target=run, name="tuneline-warm-imports", daemon=True)
    thread.start()
    return thread


def _read_metrics(output_dir: Path) -> dict[str, float]:
    for name in ("all_results.json", "train_results.json"):
        path = output_dir / name
        if path.is_file():
            data = json.loads(path.read_text())
            return {k: v for k, v in data.items() if isinstance(v, (int, float))}
    return {}
