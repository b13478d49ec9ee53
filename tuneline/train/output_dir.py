"""Whether a start resumes, starts fresh, or refuses; the child's side of output_dir.

Two keys, kept apart: the train key is exact (any change of setting or code reruns the step); the resume key
covers only what a checkpoint's optimisation depends on, so a run with other logging or saving resumes. Another
resume key in a non-empty output_dir is refused unless `overwrite_output_dir` sets the old files aside; nothing is
deleted unless `discard_checkpoints` says so."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import zipfile
from pathlib import Path
from typing import Any

from tuneline.errors import UserError
from tuneline.identity.settings import COSMETIC_KEYS, EVAL_SCHEDULE_KEYS
from tuneline.runtime.contract import (
    SUPERSEDED,
    OutputDirLock,
    changed_settings,
    describe_changes,
    foreign_entries,
    read_run_file,
    recorded_settings,
    replace_old_run,
    set_aside,
    write_run_file,
)
from tuneline.train.checkpoints import TRAINER_STATE, checkpoint_step, clear_staging, complete_checkpoints, is_complete

log = logging.getLogger(__name__)

def unreadable_file(checkpoint: Path) -> str | None:
    """Why a checkpoint cannot be loaded (the name of its first file that does not read whole), or None: a checkpoint
    published whole can still be damaged later (a full disk, a copy cut short)."""
    try:
        json.loads((checkpoint / TRAINER_STATE).read_text())
    except (OSError, ValueError):
        return f"its {TRAINER_STATE} does not read"
    from safetensors import SafetensorError, safe_open

    for path in sorted(checkpoint.rglob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except (OSError, SafetensorError) as err:
            return f"{path.relative_to(checkpoint)} does not read: {err}"
    for path in sorted(checkpoint.rglob("*.pt")) + sorted(checkpoint.rglob("*.pth")):
        try:
            with zipfile.ZipFile(path):
                pass
        except (OSError, zipfile.BadZipFile) as err:
            return f"{path.relative_to(checkpoint)} does not read: {err}"
    return None


def _resumable_checkpoint(root: Path) -> Path | None:
    """The last complete checkpoint whose files read; one that does not is set aside, never loaded."""
    for checkpoint in reversed(complete_checkpoints(root)):
        why = unreadable_file(checkpoint)
        if why is None:
            return checkpoint
        aside = set_aside(root, [checkpoint])
        log.warning("%s cannot be resumed (%s): moved to '%s'", checkpoint, why, aside)
    return None


def decide_resume(output_dir: str | Path, key: str, overwrite: bool = False, resume_from_checkpoint: Any = None,
                  *, resume_key: str | None = None, settings: dict[str, Any] | None = None,
                  discard: bool = False) -> Path | None:
    """The checkpoint to resume from (or None to start fresh); another run is refused, or with `overwrite` set aside
    (deleted only with `discard`)."""
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    clear_staging(root)
    previous = read_run_file(root) or {}
    changes = changed_settings(previous.get("settings"), settings or {})
    same_key = previous.get("train_key") == key
    compatible = same_key or bool(resume_key and previous.get("resume_key") == resume_key)
    if foreign_entries(root) and not compatible:
        shaping = {k: v for k, v in changes.items() if k not in COSMETIC_KEYS | EVAL_SCHEDULE_KEYS} or changes
        what = describe_changes(shaping) if shaping else (
            f"train key {previous['train_key'][:12]}" if previous.get("train_key") else "files of an unknown run")
        if not overwrite:
            raise UserError(
                f"output_dir '{root}' holds another run that this one cannot resume ({what}; this run's key is "
                f"{key[:12]}): set 'overwrite_output_dir: true' to move its files aside to "
                f"'{root.name}{SUPERSEDED}<time>' and start again, or choose another 'output_dir'",
                title="tuneline cannot train")
        log.warning(replace_old_run(root, discard, f"replaced a run this one cannot resume ({what})"))
        compatible = False
    if isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.lower() not in ("true", "false"):
        return _explicit_checkpoint(resume_from_checkpoint)
    checkpoint = _resumable_checkpoint(root)
    if checkpoint is not None and compatible and (changes or not same_key):
        why = f"settings changed: {describe_changes(changes)}" if changes else (
            "tuneline's training code changed, the settings did not")
        log.warning("output_dir '%s': resuming from %s (step %s) across a change that keeps the weights' "
                    "optimisation the same (%s)", root, checkpoint.name, checkpoint_step(checkpoint), why)
    elif checkpoint is not None:
        log.info("output_dir '%s': resuming from %s (step %s)", root, checkpoint.name, checkpoint_step(checkpoint))
    return checkpoint


def _explicit_checkpoint(path: str) -> Path:
    checkpoint = Path(path).expanduser()
    if not is_complete(checkpoint):
        why = "does not exist" if not checkpoint.exists() else (
            "is not a complete checkpoint-N folder (no trainer_state.json)")
        raise UserError(f"'resume_from_checkpoint' path '{path}' {why}", title="tuneline cannot train")
    return checkpoint


def prepare_output_dir(config, key: str, mlflow_run_id: str | None,
                       resume_key: str | None = None) -> tuple[OutputDirLock | None, Path | None]:
    """Lock output_dir (unless the flow's process holds its lock for this training), decide resume, write run.json.
    The caller releases the lock when training ends."""
    lock = OutputDirLock.unless_held_for(config.output_dir, mlflow_run_id=mlflow_run_id,
                                         run_name=config.pipeline.run_name)
    try:
        settings = recorded_settings(config)
        resume = decide_resume(config.output_dir, key, bool(config.training.get("overwrite_output_dir")),
                               config.training.get("resume_from_checkpoint"), resume_key=resume_key,
                               settings=settings, discard=bool(config.pipeline.discard_checkpoints))
        write_run_file(config.output_dir, train_key=key, resume_key=resume_key, settings=settings,
                       mlflow_run_id=mlflow_run_id, status="running",
                       resumed_from=str(resume) if resume else None,
                       resumed_step=checkpoint_step(resume) if resume else 0,
                       started=time.strftime("%Y-%m-%dT%H:%M:%S"), pid=os.getpid(), host=socket.gethostname())
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return lock, resume
