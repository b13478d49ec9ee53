"""The train step, from the flow's side: prepare `accelerate launch -m tuneline.train`, follow it, record it.

The parent writes the resolved config into output_dir and prepares the child's command with the MLflow run in its
environment (the child logs its own step metrics there); the task runs it (tuneline.pipeline.launch.run_streaming),
forwarding its lines and its progress, so that between the task and the child only the streaming runs; after a
clean exit the result is read from run.json, whose `status: complete` the child set: the one completion marker
(tuneline.runtime.contract), written by the child alone. A killed start leaves the status `running`, so the next
start launches again and the child resumes from its checkpoint.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tuneline.config import RunConfig, dump_config
from tuneline.content.records import BuiltDataset, ReferenceLogps
from tuneline.pipeline.follow_log import TrainerLogReader
from tuneline.pipeline.launch import TrainingFailed, launch_command
from tuneline.pipeline.records import TrainResult
from tuneline.runtime.contract import (
    COMPLETE,
    ERROR_PREFIX,
    LOCKED_ENV,
    LOG_FILE,
    RESUME_KEY_ENV,
    RUN_FILE,
    TRAIN_KEY_ENV,
    OutputDirLock,
    changed_settings,
    describe_changes,
    finished_run,
    read_run_file,
    recorded_settings,
    replace_old_run,
)

RESOLVED_CONFIG = "tuneline_config.yaml"


# How a crashed training shows in its launcher's last lines: a process killed by a signal (accelerate's launcher,
# torch's elastic agent), or out of memory.
CRASH_SIGNS = re.compile(r"died with <Signals\.|exitcode\s*:\s*-\d|Signal \d+ \(SIG|out of memory|OutOfMemoryError")


def worth_retrying(error: BaseException) -> bool:
    """Only a crash (a signal: out of memory, a lost machine, a stop) may pass on a retry. An error in the config,
    the data or the code fails the same way again, so it is not retried."""
    if not isinstance(error, TrainingFailed) or ERROR_PREFIX in str(error):
        return False
    return error.returncode < 0 or any(CRASH_SIGNS.search(line) for line in error.tail)


def standing_run(output_dir: Path, key: str, resume_key: str) -> dict | None:
    """run.json of a finished training in output_dir that stands for `key`: that exact one, or one whose key differs
    only in what does not shape the weights (logging, saving, code), kept instead of training again from step 0."""
    done = finished_run(output_dir)
    return done if done and (done.get("train_key") == key or done.get("resume_key") == resume_key) else None


def finished_for(config: RunConfig, key: str, dataset: BuiltDataset, reference: ReferenceLogps | None) -> bool:
    """Whether the train step's cached result for `key` is still whole."""
    return standing_run(config.output_dir, key, _resume_key(config, dataset, reference)) is not None


def _kept(done: dict, config: RunConfig) -> str:
    changes = changed_settings(done.get("settings"), recorded_settings(config))
    why = f"settings changed: {describe_changes(changes)}" if changes else "tuneline's training code changed"
    return (f"output_dir '{config.output_dir}': the finished training is kept, as nothing that shapes its weights "
            f"changed ({why}); set 'refresh_cache: true' to train again")


@dataclass
class Launch:
    """One start of the training child, as `prepare_training` leaves it: the caller runs `command` in `env` with
    `launch.run_streaming`, passing each line to `forward`, then takes `result()`. Nothing to run (`command` empty)
    where a finished training stands for this key: `result()` is that one."""

    config: RunConfig
    key: str
    resume_key: str
    mlflow_run_id: str | None
    tracking_uri: str | None
    on_line: Callable[[str], None]
    on_progress: Callable[[dict], None] | None
    lock: OutputDirLock | None = None
    finished: TrainResult | None = None
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    progress: TrainerLogReader | None = None

    def release(self) -> None:
        """The output_dir's lock, held from `prepare_training` until the child ended (and its result was read)."""
        if self.lock is not None:
            self.lock.release()

    def forward(self, line: str) -> None:
        """A line of the child to `on_line`; the newest trainer_log.jsonl entry to `on_progress`, at most every
        follow_log.INTERVAL_S."""
        self.on_line(line)
        entries = self.progress.due()
        if self.on_progress and entries:
            self.on_progress(entries[-1])

    def result(self) -> TrainResult:
        """A small reference to the training: the finished one, or the one the child just ended cleanly. run.json
        is read, never written here: the child alone writes it (keys, settings, run id, `status: complete`)."""
        if self.finished is not None:
            return self.finished
        if self.on_progress and (last := self.progress.new_entries()):  # the end, within the last interval
            self.on_progress(last[-1])
        run = read_run_file(self.config.output_dir) or {}
        if run.get("status") != COMPLETE or run.get("train_key") != self.key:
            raise RuntimeError(f"the training in '{self.config.output_dir}' exited cleanly without marking its "
                               f"{RUN_FILE} complete for this run's key")  # a bug of tuneline.train, never a user's
        return _reference(run, self.config.output_dir)


def prepare_training(config: RunConfig, dataset: BuiltDataset, reference: ReferenceLogps | None, key: str,
                     mlflow_run_id: str | None, tracking_uri: str | None, on_line: Callable[[str], None] = print,
                     on_progress: Callable[[dict], None] | None = None, start_fresh: bool = False) -> Launch:
    """What training (or resuming) into config.output_dir takes: the child's command, or a finished training.

    The training's one lock on output_dir is taken here, before anything is written or launched (another trainer
    there is refused, named), and held until `Launch.release`; the child finds it held for it (LOCKED_ENV).
    `start_fresh` (a forced rerun, first attempt only: a retry must resume) trains again from step 0.
    """
    output_dir = config.output_dir
    lock = OutputDirLock(output_dir, mlflow_run_id=mlflow_run_id, run_name=config.pipeline.run_name)
    try:
        launch = Launch(config, key, _resume_key(config, dataset, reference), mlflow_run_id, tracking_uri, on_line,
                        on_progress, lock)
        if start_fresh:
            if moved := replace_old_run(output_dir, config.pipeline.discard_checkpoints,
                                        "'refresh_cache' trains again from step 0"):
                on_line(moved)
        elif done := standing_run(output_dir, key, launch.resume_key):  # e.g. the orchestrator lost its record
            if done.get("train_key") != key:
                on_line(_kept(done, config))
            launch.finished = _reference(done, output_dir)
        if launch.finished is None:
            _prepare_child(launch, dataset, reference)
    except BaseException:
        lock.release()
        raise
    if launch.finished is not None:
        launch.release()
    return launch


def _prepare_child(launch: Launch, dataset: BuiltDataset, reference: ReferenceLogps | None) -> None:
    config, output_dir = launch.config, launch.config.output_dir
    # credentials stay out of the resolved config, which the run logs to MLflow; the child never publishes, and
    # reads a gated model's token from the environment, where huggingface_hub looks for it
    config_path = dump_config(config.without_secrets(), output_dir / RESOLVED_CONFIG)
    launch.command = launch_command(config, config_path, reference.training_data(dataset) if reference else dataset.path)
    launch.env = {**os.environ, TRAIN_KEY_ENV: launch.key, RESUME_KEY_ENV: launch.resume_key,
                  LOCKED_ENV: str(output_dir.resolve())}
    if config.model.hf_hub_token:
        launch.env["HF_TOKEN"] = config.model.hf_hub_token
    if launch.mlflow_run_id:
        launch.env.update({"MLFLOW_RUN_ID": launch.mlflow_run_id, "MLFLOW_TRACKING_URI": str(launch.tracking_uri)})
    launch.progress = TrainerLogReader(output_dir / LOG_FILE, skip_existing=True)  # before the child can touch it


def _reference(run: dict, output_dir: Path) -> TrainResult:
    """What the step returns: a small reference to the finished training in `output_dir` (run.json also keeps its
    settings, to name later changes, and how it ran). A start killed after the child marked run.json complete and
    before the flow added its result left only the child's fields: the metrics are then read from output_dir."""
    return TrainResult(output_dir=str(output_dir), train_key=run["train_key"], metrics=_read_metrics(Path(output_dir)),
                       mlflow_run_id=run.get("mlflow_run_id"), resume_key=run.get("resume_key"))


def _resume_key(config: RunConfig, dataset: BuiltDataset, reference: ReferenceLogps | None) -> str:
    from tuneline.identity import keys

    return keys.resume_key(config, dataset.fingerprint, reference.fingerprint if reference else None)


def _read_metrics(output_dir: Path) -> dict[str, float]:
    for name in ("all_results.json", "train_results.json"):
        path = output_dir / name
        if path.is_file():
            data = json.loads(path.read_text())
            return {k: v for k, v in data.items() if isinstance(v, (int, float))}
    return {}
