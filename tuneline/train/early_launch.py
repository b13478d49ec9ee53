"""A training launch started before its arguments are known, so its start-up overlaps the orchestration.

From the command to the first training step, `accelerate launch` and the child's imports (torch, transformers,
peft, the stage's trainer) take ~6 s on 2 CPU cores, and in a flow they come only after Prefect's server has
booted and the steps before `train` have run. `EarlyLaunch` runs the same launch at the start with
`--wait-for-start FILE`: each process imports, then waits for FILE. `begin` writes FILE (the entry point's
arguments and the environment entries decided since, such as the MLflow run) and the processes go on as if
launched then; a launch that cannot stand for the real one (another command, another environment) is stopped
and the caller launches as before. Until FILE exists the processes only import: they touch no output_dir, lock,
GPU or MLflow run, so stopping one that was not needed (a cache hit, an error before `train`) is always safe.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tuneline.train.launch import process_env, start_process
from tuneline.train.trainer_log import FLOW_SENDS_METRICS

# What may still change after the imports: the entry point reads these only once it starts; and the
# variable torch's inductor sets on import to its default (in the flow's process when an earlier step imported
# torch, and in the child as it imports), read only when something compiles.
START_ENV = frozenset({"TUNELINE_TRAIN_KEY", "MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI", FLOW_SENDS_METRICS,
                       "TORCHINDUCTOR_CACHE_DIR"})
ENTRY = ["-m", "tuneline.train"]
POLL_S = 0.02
FOLDER_PREFIX = "tuneline-start-"


class EarlyLaunch:
    """`launcher -m tuneline.train --wait-for-start FILE --stage STAGE`, started now with `env`."""

    def __init__(self, launcher: list[str], stage: str, env: dict[str, str] | None = None):
        self.launcher, self.env = list(launcher), process_env(env)
        remove_abandoned_folders(Path(tempfile.gettempdir()))
        self.folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
        self.start_file = self.folder / "start.json"
        self.process = start_process([*self.launcher, *ENTRY, "--wait-for-start", str(self.start_file),
                                      "--stage", stage], self.env)

    def begin(self, cmd: list[str], env: dict[str, str] | None) -> subprocess.Popen | None:
        """Start training as `cmd` with `env` would, and return the process; None (and stopped) if it cannot."""
        wanted = process_env(env)
        changed = {k: v for k, v in wanted.items() if self.env.get(k) != v}
        same_launch = cmd[:len(self.launcher) + len(ENTRY)] == [*self.launcher, *ENTRY]
        if (not same_launch or self.process.poll() is not None or self.env.keys() - wanted.keys()
                or not changed.keys() <= START_ENV):
            self.close()
            return None
        tmp = self.folder / ".start.json.tmp"
        tmp.write_text(json.dumps({"argv": cmd[len(self.launcher) + len(ENTRY):], "env": changed}))
        os.replace(tmp, self.start_file)  # whole or absent: a process never reads half of it
        return self.process

    def close(self) -> None:
        """Stop the launch if it still runs (its processes die with the launcher), and remove the start file.

        After `begin`, call it once the training has ended.
        """
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self.process.stdout and not self.process.stdout.closed:
            self.process.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def remove_abandoned_folders(parent: Path) -> None:
    """Remove the start folders of commands that are gone: one killed (SIGKILL, a lost machine) never ran `close`.

    A folder is named after the process that made it; one whose process still runs, or may (another user's,
    which we may not signal), stays.
    """
    for folder in parent.glob(f"{FOLDER_PREFIX}*-*"):
        pid = folder.name[len(FOLDER_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # not ours to signal: it exists
        return True
    return True


def wait_for_start(start_file: str | Path, stage: str) -> list[str]:
    """In the launched process: import what `stage` trains with, wait for the start file, take its environment
    entries and return the entry point's arguments.

    What is needed only once training runs (the text metrics of the evaluation after training) is imported
    while the start has not come, never in its way: when the flow is ready first, those imports would hold up
    its first step. MLflow is not: the flow sends this training's metrics itself, and a training that uploads
    checkpoints imports it at its first save.
    """
    began = time.monotonic()
    import tuneline.train.training_args  # noqa: F401 - what the entry point imports first
    from tuneline.train import stage_runner

    stage_runner(stage)
    imported = time.monotonic()
    path = Path(start_file)
    if not path.exists():
        _import_metric_libraries(stage)
    while not path.exists():
        time.sleep(POLL_S)
    start = json.loads(path.read_text())
    os.environ.update(start["env"])
    logging.getLogger(__name__).info("started early: imports took %.1f s, then the start came %.1f s later",
                                     imported - began, time.monotonic() - imported)
    return start["argv"]


def _import_metric_libraries(stage: str) -> None:
    from tuneline.evaluation.run import import_metric_libraries

    import_metric_libraries(stage)
