"""Run training as a subprocess (`accelerate launch -m tuneline.train`) that resumes itself.

The parent writes the resolved config into output_dir, launches the child with the MLflow run in its
environment, forwards its lines, its progress and the metrics of its trainer_log.jsonl (to MLflow), and marks
the output complete only after a clean exit. A killed parent leaves no marker, so the next start launches again
and the child resumes from its checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneline.config import RunConfig, dump_config
from tuneline.errors import UserError
from tuneline.pipeline.follow_log import MetricsSender, TrainerLogReader
from tuneline.pipeline.give_way import run_as_watcher, watchers_give_way
from tuneline.train.trainer_log import FLOW_SENDS_METRICS, LOG_FILE

if TYPE_CHECKING:
    from tuneline.train.early_launch import EarlyLaunch

COMPLETE_MARKER = "TRAIN_COMPLETE.json"
RESOLVED_CONFIG = "tuneline_config.yaml"


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


def evaluation_input(config: RunConfig, dataset_ref: dict) -> Path | None:
    """The build-dataset result the child evaluates its model on for the evaluate step, saved beside the config.

    None when there are no validation rows, or when every step reruns anyway (refresh_cache: the step would
    not take the child's result).
    """
    if config.pipeline.refresh_cache or not dataset_ref.get("eval_rows"):
        return None
    from tuneline.train.output_dir import EVAL_DATASET_REF

    return _write_json(config.output_dir / EVAL_DATASET_REF, dataset_ref)  # hidden: not a model file for MLflow


def _write_json(path: Path, data: dict) -> Path:
    """Whole or absent: the child and later runs never read half a file."""
    tmp = path.with_name(f".{path.name.lstrip('.')}.tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)
    return path


def train_model(config: RunConfig, dataset_ref: dict, reference_ref: dict | None, key: str,
                mlflow_run_id: str | None, tracking_uri: str | None,
                on_line: Callable[[str], None] = print,
                on_progress: Callable[[dict], None] | None = None, start_fresh: bool = False) -> dict[str, Any]:
    """Train (or resume) into config.output_dir; return a small reference to the result.

    Each output line of the child goes to `on_line`; `on_progress` gets the newest trainer_log.jsonl entry at
    most every follow_log.INTERVAL_S, when the new entries' metrics go to the MLflow run `mlflow_run_id` (sent
    from here, not by the child). `start_fresh` (a forced rerun, first attempt only: a retry must resume)
    trains again from step 0. A launch started early for this run (`early_launch`) is used when it matches.
    Both are called from a thread that follows the training at a low CPU priority (tuneline.pipeline.give_way).
    """
    from tuneline.train.launch import launch_command, run_streaming, start_process

    output_dir = config.output_dir
    if start_fresh:
        start_over(output_dir)
    elif training_complete(output_dir, key):  # finished before, e.g. the orchestrator lost its record
        return json.loads((output_dir / COMPLETE_MARKER).read_text())
    output_dir.mkdir(parents=True, exist_ok=True)
    config_path = dump_config(config, output_dir / RESOLVED_CONFIG)
    cmd = launch_command(config, config_path, training_input(dataset_ref, reference_ref),
                         evaluation_input(config, dataset_ref))
    env = {**os.environ, "TUNELINE_TRAIN_KEY": key, "PYTHONUNBUFFERED": "1"}
    if mlflow_run_id:
        env.update({"MLFLOW_RUN_ID": mlflow_run_id, "MLFLOW_TRACKING_URI": str(tracking_uri), FLOW_SENDS_METRICS: "1"})
    reader = TrainerLogReader(output_dir / LOG_FILE, skip_existing=True)  # before the child can touch it
    sender: MetricsSender | None = None

    def hand_over(entries: list[dict]) -> None:
        if sender:
            sender.send(entries)
        if on_progress and entries:
            on_progress(entries[-1])

    def forward(line: str) -> None:
        on_line(line)
        hand_over(reader.due())

    early = _take_early_launch()
    process = early.begin(cmd, env) if early else None
    warm = _import_while_training()
    try:
        sender = MetricsSender(mlflow_run_id, tracking_uri, output_dir) if mlflow_run_id else None
        started = process or start_process(cmd, env)  # by this thread: the training takes its priority
        with watchers_give_way():  # after the threads above started: they are watchers too
            run_as_watcher(lambda: run_streaming(cmd, env, forward, started), interrupted=started.kill)
    except BaseException:
        with contextlib.suppress(Exception):  # the training's own error is the one to report
            _finish_metrics(reader, sender)
        raise
    else:
        _finish_metrics(reader, sender)
    finally:
        warm.join()  # no thread of ours outlives the step
        if early:
            early.close()
    metrics = _read_metrics(output_dir)
    ref = {"output_dir": str(output_dir), "train_key": key, "metrics": metrics, "mlflow_run_id": mlflow_run_id}
    _write_json(output_dir / COMPLETE_MARKER, ref)
    return ref


def _finish_metrics(reader: TrainerLogReader, sender: MetricsSender | None) -> None:
    """Send what the child logged since the last hand-over (a failed or killed one too: its steps happened) and
    wait for the sender; what MLflow could not take stays in output_dir's spool."""
    if sender:
        try:
            sender.send(reader.new_entries())
        finally:
            sender.close()


_early: EarlyLaunch | None = None


@contextlib.contextmanager
def early_launch(config: RunConfig) -> Iterator[EarlyLaunch | None]:
    """Within: the launch this run's `train` step will need runs already, importing while the flow starts.

    Only when that step will train (forced, or no finished training for its key in output_dir), so a cached
    re-run starts nothing; not for a ppo run whose reward model a subflow trains first (that run's `train` comes
    after a whole training). An early launch `train` did not use is stopped on exit.
    """
    global _early
    launch = None
    if not config.pipeline.reward_model_config and training_needed(config):
        from tuneline.train.early_launch import EarlyLaunch
        from tuneline.train.launch import launcher

        with contextlib.suppress(OSError):  # not started (no temp space, no process): `train` launches as ever
            launch = _early = EarlyLaunch(launcher(config), config.stage)
    try:
        yield launch
    finally:
        _early = None
        if launch:
            launch.close()


def training_needed(config: RunConfig) -> bool:
    """Whether this run's `train` step will launch a training: forced, or none finished for its key."""
    from tuneline.pipeline import keys

    if config.pipeline.refresh_cache:
        return True
    dataset_fp = keys.dataset_key(config)
    return not training_complete(config.output_dir,
                                 keys.train_key(config, dataset_fp, keys.reference_key(config, dataset_fp)))


def _take_early_launch() -> EarlyLaunch | None:
    """The early launch, once: a retry of the step launches anew."""
    global _early
    launch, _early = _early, None
    return launch


def _import_while_training() -> threading.Thread:
    """Import the plot step's matplotlib (~0.5 s here) while the child trains, not after it."""

    def run() -> None:
        try:
            import matplotlib.backends.backend_agg  # noqa: F401
            import matplotlib.figure  # noqa: F401
        except Exception:  # noqa: BLE001 - the plot step imports them again and reports any error
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
