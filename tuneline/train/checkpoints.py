"""Checkpoints that are complete or absent.

transformers 5 writes `checkpoint-N` in place, so a crash mid-save leaves a folder its own `get_last_checkpoint`
would resume from. tuneline writes under `<output_dir>/.partial/` and renames once every process has written:
the rename is the proof of completeness."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

STAGING_DIR = ".partial"
TRAINER_STATE = "trainer_state.json"
_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_step(path: str | Path) -> int | None:
    """The global step in a `checkpoint-N` folder name, else None."""
    match = _CHECKPOINT_NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def is_complete(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and checkpoint_step(path) is not None and (path / TRAINER_STATE).is_file()


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints under output_dir, oldest step first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if is_complete(p)]
    return sorted(found, key=checkpoint_step)


def last_complete_checkpoint(output_dir: str | Path) -> Path | None:
    found = complete_checkpoints(output_dir)
    return found[-1] if found else None


def staging_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / STAGING_DIR


def clear_staging(output_dir: str | Path) -> None:
    """Drop what a killed save left behind (never resumed from, so only wasted disk)."""
    shutil.rmtree(staging_root(output_dir), ignore_errors=True)


def publish(staged: str | Path, final: str | Path) -> Path:
    """Rename a whole staged checkpoint into place; an older folder of the same name is replaced."""
    staged, final = Path(staged), Path(final)
    if final.exists():
        trash = staged.parent / f"replaced-{final.name}"
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(staged, final)
    _fsync_dir(final.parent)
    return final


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
