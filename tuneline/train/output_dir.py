"""Who owns an output_dir, and whether a start resumes, starts fresh, or refuses (DESIGN.md section 3).

- `run.json` holds the train key (what the result depends on) and the MLflow run id, written before training.
- An OS file lock is held for as long as a process trains there; a second trainer gets an error naming the holder.
- Same key and a complete checkpoint -> resume from the last complete one. A different key in a non-empty
  output_dir -> a UserError, unless `overwrite_output_dir` (then the old run's files are removed).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from tuneline.errors import UserError
from tuneline.fingerprint import fingerprint, hash_files
from tuneline.train.checkpoints import checkpoint_step, clear_staging, is_complete, last_complete_checkpoint

RUN_FILE = "run.json"
LOCK_FILE = ".tuneline.lock"
OWNER_FILE = ".tuneline.lock.owner"
TRAIN_CODE_VERSION = "train-1"
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
})


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
    """The key of one training result: model, dataset reference, the config that shapes the weights, code."""
    if model_fp is None:
        model_fp = model_fingerprint(config, Path(config.pipeline.pipeline_cache_dir) / "hashes")
    shaping = {}
    for group in (config.model, config.finetuning):
        shaping.update({k: v for k, v in vars(group).items() if k not in COSMETIC_KEYS})
    shaping.update({k: v for k, v in config.training.items() if k not in COSMETIC_KEYS})
    data_fp = (dataset_ref or {}).get("fingerprint") or (dataset_ref or {}).get("path")
    return fingerprint(TRAIN_CODE_VERSION, model_fp, data_fp, shaping)


class OutputDirLock:
    """An exclusive OS lock on output_dir (released by the OS when the process dies, even by SIGKILL)."""

    def __init__(self, output_dir: str | Path):
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
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        (self.root / OWNER_FILE).write_text(json.dumps(owner))

    def release(self) -> None:
        if self._lock.is_locked:
            (self.root / OWNER_FILE).unlink(missing_ok=True)
            self._lock.release()


def _describe_owner(root: Path) -> str:
    try:
        owner = json.loads((root / OWNER_FILE).read_text())
        return f"pid {owner['pid']} on host {owner['host']} holds its lock since {owner['since']}"
    except (OSError, ValueError, KeyError):
        return "another process holds its lock"


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


def _clear(entries: list[Path]) -> None:
    for entry in entries:
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


def decide_resume(output_dir: str | Path, key: str, overwrite: bool = False,
                  resume_from_checkpoint: Any = None) -> Path | None:
    """The checkpoint to resume from (or None to start fresh); clears another run's files when allowed."""
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    clear_staging(root)
    previous = read_run_file(root)
    foreign = _foreign_entries(root)
    if foreign and (previous is None or previous.get("train_key") != key):
        if not overwrite:
            what = f"train key {previous.get('train_key', '?')[:12]}" if previous else "files of an unknown run"
            raise UserError(
                f"output_dir '{root}' holds another run ({what}; this run's key is {key[:12]}): set "
                "'overwrite_output_dir: true' to replace it, or choose another 'output_dir'",
                title="tuneline cannot train")
        _clear(foreign)
    if isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.lower() not in ("true", "false"):
        return _explicit_checkpoint(resume_from_checkpoint)
    return last_complete_checkpoint(root)


def _explicit_checkpoint(path: str) -> Path:
    checkpoint = Path(path).expanduser()
    if not is_complete(checkpoint):
        why = "does not exist" if not checkpoint.exists() else (
            "is not a complete checkpoint-N folder (no trainer_state.json)")
        raise UserError(f"'resume_from_checkpoint' path '{path}' {why}", title="tuneline cannot train")
    return checkpoint


def prepare_output_dir(config, key: str, mlflow_run_id: str | None) -> tuple[OutputDirLock, Path | None]:
    """Lock output_dir, decide resume, write run.json. The caller releases the lock when training ends."""
    lock = OutputDirLock(config.output_dir)
    try:
        resume = decide_resume(config.output_dir, key, bool(config.training.get("overwrite_output_dir")),
                               config.training.get("resume_from_checkpoint"))
        write_run_file(config.output_dir, train_key=key, mlflow_run_id=mlflow_run_id, status="running",
                       resumed_from=str(resume) if resume else None,
                       resumed_step=checkpoint_step(resume) if resume else 0,
                       started=time.strftime("%Y-%m-%dT%H:%M:%S"), pid=os.getpid(), host=socket.gethostname())
    except BaseException:
        lock.release()
        raise
    return lock, resume
