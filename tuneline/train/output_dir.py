"""Who owns an output_dir, and whether a start resumes, starts fresh, or refuses (DESIGN.md section 3).

- `run.json` holds the train key (what the result depends on) and the MLflow run id, written before training.
- An OS file lock is held for as long as a process trains there; a second trainer gets an error naming the holder.
- Two keys, kept apart: the train key is exact (any change of setting or code reruns the step); the resume key
  covers only what a checkpoint's optimisation depends on (model, data, the settings that shape the weights).
  Same train key, or same resume key -> resume from the last complete checkpoint (saying which settings changed).
  Another resume key in a non-empty output_dir -> a UserError naming the changes, unless `overwrite_output_dir`,
  which sets the old run's files aside in a sibling `<output_dir>.superseded-<time>/` folder.
- Nothing is deleted unless the user names it: `discard_checkpoints: true` removes instead of setting aside.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
import zipfile
from pathlib import Path
from typing import Any

from tuneline.errors import UserError
from tuneline.fingerprint import fingerprint, hash_files
from tuneline.train.checkpoints import TRAINER_STATE, checkpoint_step, clear_staging, complete_checkpoints, is_complete

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
LOCK_FILE = ".tuneline.lock"
OWNER_FILE = ".tuneline.lock.owner"
TRAIN_CODE_VERSION = "train-1"
SUPERSEDED = ".superseded-"  # `<output_dir>.superseded-<time>`: a replaced run's files, set aside
# Files that may sit in an output_dir before training without making it "another run's": the lock, and
# the input the launcher writes there first (the resolved config, as any top-level *.yaml).
_HARMLESS = {LOCK_FILE, OWNER_FILE}

# Keys that change how a run is watched or stored, not the weights it ends with.
COSMETIC_KEYS = frozenset({
    "output_dir", "overwrite_output_dir", "resume_from_checkpoint", "logging_dir", "logging_steps",
    "logging_strategy", "logging_first_step", "logging_nan_inf_filter", "log_level", "log_level_replica",
    "log_on_each_node", "disable_tqdm", "report_to", "run_name", "project", "save_steps", "save_strategy",
    "save_total_limit", "save_on_each_node", "save_safetensors", "save_only_model", "push_to_hub", "hub_token",
    "hub_model_id", "hub_strategy", "hub_private_repo", "hub_always_push", "hub_revision", "dataloader_num_workers",
    "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor", "skip_memory_metrics",
    "include_num_input_tokens_seen", "hf_hub_token", "cache_dir", "export_dir", "export_size", "export_device",
    "export_legacy_format", "plot_loss", "include_effective_tokens_per_second", "per_device_eval_batch_size",
    "eval_accumulation_steps", "ddp_timeout", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id",
    "discard_checkpoints",
})
# When evaluations run: cosmetic too, unless an evaluation decides the weights (best model, early stopping).
EVAL_SCHEDULE_KEYS = frozenset({"eval_steps", "eval_strategy", "eval_delay", "eval_on_start", "eval_do_concat_batches"})


def weight_neutral_keys(config) -> frozenset[str]:
    """Keys a checkpoint can be resumed across: they change how a run is watched or stored, not its weights."""
    decides = config.training.get("load_best_model_at_end") or config.finetuning.early_stopping_steps
    return COSMETIC_KEYS if decides else COSMETIC_KEYS | EVAL_SCHEDULE_KEYS


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


def model_fingerprint(config, memo_dir: str | Path | None = None) -> str:
    """Content hash of a local model folder (memoised by path, size and mtime); name + revision for a hub id."""
    root = Path(str(config.model.model_name_or_path)).expanduser()
    if not root.is_dir():
        return fingerprint("hub", config.model.model_name_or_path, config.model.model_revision)
    hashes = hash_files([root], memo_dir)
    return fingerprint("model", {str(Path(k).relative_to(root)): v for k, v in hashes.items()})


def train_key(config, dataset_ref: dict[str, Any] | None, model_fp: str | None = None) -> str:
    """The key of one training result when the child runs alone (no flow gave it one): model, dataset reference,
    the config that shapes the weights. It serves as the resume key too."""
    if model_fp is None:
        model_fp = model_fingerprint(config, Path(config.pipeline.pipeline_cache_dir) / "hashes")
    neutral = weight_neutral_keys(config)
    shaping = {}
    for group in (config.model, config.finetuning):
        shaping.update({k: v for k, v in vars(group).items() if k not in neutral})
    shaping.update({k: v for k, v in config.training.items() if k not in neutral})
    data_fp = (dataset_ref or {}).get("fingerprint") or (dataset_ref or {}).get("path")
    return fingerprint(TRAIN_CODE_VERSION, model_fp, data_fp, shaping)


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


def write_run_file(output_dir: str | Path, **fields: Any) -> dict[str, Any]:
    """Merge fields into run.json (written to a temp name, then renamed)."""
    path = Path(output_dir) / RUN_FILE
    data = {**(read_run_file(output_dir) or {}), **fields}
    tmp = path.with_name(f".{RUN_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)
    return data


def _foreign_entries(root: Path) -> list[Path]:
    """What would be lost by starting over: everything but the lock and the launcher's inputs."""
    return [p for p in root.iterdir() if p.name not in _HARMLESS and not (p.is_file() and p.suffix in (".yaml", ".yml"))]


def set_aside(root: Path, entries: list[Path]) -> Path:
    """Move entries of output_dir into a new sibling `<output_dir>.superseded-<time>/`, each by one rename (same
    filesystem, so nothing is copied and nothing is ever in neither place). run.json goes last: a start killed
    midway still finds the old run's record and sets the rest aside too."""
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
    entries = _foreign_entries(root)
    if not entries:
        return None
    if discard:
        _remove(entries)
        return f"output_dir '{root}': {why}; its files were deleted ('discard_checkpoints: true')"
    aside = set_aside(root, entries)
    return f"output_dir '{root}': {why}; its files were moved to '{aside}' (delete that folder when no longer needed)"


def unreadable_file(checkpoint: Path) -> str | None:
    """Why a checkpoint cannot be loaded (the name of its first file that does not read whole), or None.

    A checkpoint published whole can still be damaged later (a full disk, a copy cut short): its trainer state
    must parse, each safetensors file's header must cover the file exactly (safetensors.safe_open checks that), and
    each torch file (optimizer, scheduler, RNG: zip archives) must end with its central directory."""
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
    """The checkpoint to resume from (or None to start fresh).

    Resumes a run with the same train key, or with the same resume key (saying which settings changed). Another
    run is refused, or with `overwrite` set aside (deleted only with `discard`)."""
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    clear_staging(root)
    previous = read_run_file(root) or {}
    changes = changed_settings(previous.get("settings"), settings or {})
    same_key = previous.get("train_key") == key
    compatible = same_key or bool(resume_key and previous.get("resume_key") == resume_key)
    if _foreign_entries(root) and not compatible:
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
                       resume_key: str | None = None) -> tuple[OutputDirLock, Path | None]:
    """Lock output_dir, decide resume, write run.json. The caller releases the lock when training ends."""
    lock = OutputDirLock(config.output_dir, mlflow_run_id=mlflow_run_id, run_name=config.pipeline.run_name)
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
        lock.release()
        raise
    return lock, resume
