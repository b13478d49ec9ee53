"""What the flow's process and the training child agree on, so that neither side imports the other."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from tuneline.errors import UserError

# The child prints a problem the user can fix as one line starting with this, and exits 2: the parent shows that
# line instead of a traceback, and does not retry (the same config fails the same way).
ERROR_PREFIX = "tuneline: error: "

TRAIN_KEY_ENV = "TUNELINE_TRAIN_KEY"  # the train step's key, so the child needs not compute it again
RESUME_KEY_ENV = "TUNELINE_RESUME_KEY"  # what a checkpoint's optimisation depends on: resumable across other changes
DIE_WITH_PARENT_ENV = "TUNELINE_DIE_WITH_PARENT"  # "1": the child dies with the process that launched it
LOCKED_ENV = "TUNELINE_OUTPUT_DIR_LOCKED"  # the output_dir whose lock the launching process holds for the child

LOG_FILE = "trainer_log.jsonl"  # in output_dir: one line per logged step, written by the child, read for progress
METRICS_SPOOL_DIR = "mlflow_spool"  # in output_dir: step metrics kept while MLflow is unreachable
PREDICTIONS_FILE = "generated_predictions.jsonl"  # in output_dir: predict_with_generate's answers
COMPLETE = "complete"  # run.json's status once the training finished (and the flow recorded its result)


def die_with_parent(signum: int = signal.SIGKILL) -> bool:
    """This process gets `signum` when its parent dies, even by SIGKILL (Linux only; False elsewhere), so no orphan
    keeps training and holding its lock."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signum) == 0  # PR_SET_PDEATHSIG
    except OSError:
        return False


def die_with_parent_if_asked() -> None:
    """In a process launched with DIE_WITH_PARENT_ENV set: dies with its parent, at once where the parent died
    before prctl took effect (this process is then the init process's)."""
    if os.environ.get(DIE_WITH_PARENT_ENV) == "1" and die_with_parent() and os.getppid() == 1:
        os._exit(1)


# --- run.json and the lock (the settings that do not shape the weights: tuneline.identity.settings)
RUN_FILE = "run.json"
LOCK_FILE = ".tuneline.lock"
OWNER_FILE = ".tuneline.lock.owner"
SUPERSEDED = ".superseded-"  # `<output_dir>.superseded-<time>`: a replaced run's files, set aside
# Files that may sit in an output_dir before training without making it "another run's": the lock, and
# the input the launcher writes there first (the resolved config, as any top-level *.yaml).
_HARMLESS = {LOCK_FILE, OWNER_FILE}

def recorded_settings(config) -> dict[str, Any]:
    """Every setting as plain JSON, credentials unset: kept in run.json to name what changed at the next start."""
    return json.loads(json.dumps(config.without_secrets().flat(), default=str))


def changed_settings(before: dict[str, Any] | None, now: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    if not before:
        return {}
    return {k: (before.get(k), now.get(k)) for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)}


def _shown(value: Any) -> str:
    """A value as a user would write it in YAML (`5`, not the `5.0` the training arguments hold)."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else repr(value)


def describe_changes(changes: dict[str, tuple[Any, Any]], limit: int = 8) -> str:
    shown = [f"{k} {_shown(old)} -> {_shown(new)}" for k, (old, new) in list(changes.items())[:limit]]
    more = f" and {len(changes) - limit} more" if len(changes) > limit else ""
    return "; ".join(shown) + more


class LockHeld(UserError):
    """Another process trains in this output_dir."""


class OutputDirLock:
    """An exclusive OS lock on output_dir, released by the OS when the process dies (even by SIGKILL), so a dead
    holder's lock is taken over by the next start; the owner file names the holder for the one refused."""

    def __init__(self, output_dir: str | Path, **about: Any):
        from filelock import FileLock, Timeout

        self.root = Path(output_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(self.root / LOCK_FILE), timeout=0)
        try:
            self._lock.acquire()
        except Timeout:
            raise LockHeld(f"output_dir '{self.root}' is in use: {_describe_owner(self.root)}. Wait for that "
                           "training to finish or stop it, or choose another 'output_dir'",
                           title="tuneline cannot train") from None
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S"),
                 **{k: v for k, v in about.items() if v}}
        (self.root / OWNER_FILE).write_text(json.dumps(owner, default=str))

    def release(self) -> None:
        if self._lock.is_locked:
            (self.root / OWNER_FILE).unlink(missing_ok=True)
            self._lock.release()

    @classmethod
    def unless_held_for(cls, output_dir: str | Path, **about: Any) -> OutputDirLock | None:
        """The lock of output_dir, or None where the process that launched this one holds it for this training
        (it named this output_dir in LOCKED_ENV): a training takes the lock once."""
        if os.environ.get(LOCKED_ENV) == str(Path(output_dir).resolve()):
            return None
        return cls(output_dir, **about)


def _describe_owner(root: Path) -> str:
    try:
        owner = json.loads((root / OWNER_FILE).read_text())
        text = f"pid {owner['pid']} on host {owner['host']} holds its lock since {owner['since']}"
    except (OSError, ValueError, KeyError):
        return "another process holds its lock"
    about = [f"MLflow run {owner['mlflow_run_id']}" if owner.get("mlflow_run_id") else "",
             f"run '{owner['run_name']}'" if owner.get("run_name") else ""]
    return text + (f" ({', '.join(a for a in about if a)})" if any(about) else "")


def read_run_file(output_dir: str | Path) -> dict[str, Any] | None:
    path = Path(output_dir) / RUN_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_run_file(output_dir: str | Path, /, **fields: Any) -> dict[str, Any]:
    """Merge fields into run.json (written to a temp name, then renamed)."""
    path = Path(output_dir) / RUN_FILE
    data = {**(read_run_file(output_dir) or {}), **fields}
    tmp = path.with_name(f".{RUN_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)
    return data


def finished_run(output_dir: str | Path) -> dict[str, Any] | None:
    """run.json of a training that finished, else None: the one completion marker both sides read."""
    run = read_run_file(output_dir)
    return run if run and run.get("status") == COMPLETE else None


def training_complete(output_dir: str | Path, key: str) -> bool:
    """True when output_dir holds a finished training for exactly this train key."""
    return (finished_run(output_dir) or {}).get("train_key") == key


def foreign_entries(root: Path) -> list[Path]:
    """What would be lost by starting over: everything but the lock and the launcher's inputs."""
    return [p for p in root.iterdir() if p.name not in _HARMLESS and not (p.is_file() and p.suffix in (".yaml", ".yml"))]


def set_aside(root: Path, entries: list[Path]) -> Path:
    """Move entries of output_dir into a new sibling `<output_dir>.superseded-<time>/`, each by one rename. run.json
    goes last: a start killed midway still finds the old run's record and sets the rest aside too."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1000):
        aside = root.with_name(f"{root.name}{SUPERSEDED}{stamp}" + (f"-{attempt}" if attempt else ""))
        try:
            aside.mkdir()
            break
        except FileExistsError:
            continue
    for entry in sorted(entries, key=lambda p: p.name == RUN_FILE):
        os.replace(entry, aside / entry.name)
    return aside


def _remove(entries: list[Path]) -> None:
    for entry in entries:
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


def replace_old_run(root: Path, discard: bool, why: str) -> str | None:
    """Make room for a fresh start: set the old run's files aside, or delete them when the user asked to.
    Returns the line that tells the user where they went (None when there was nothing)."""
    entries = foreign_entries(root)
    if not entries:
        return None
    if discard:
        _remove(entries)
        return f"output_dir '{root}': {why}; its files were deleted ('discard_checkpoints: true')"
    aside = set_aside(root, entries)
    return f"output_dir '{root}': {why}; its files were moved to '{aside}' (delete that folder when no longer needed)"
