"""Step results stored by fingerprint: `<pipeline_cache_dir>/<step>/<fingerprint>/`, complete or absent.

A folder without the `COMPLETE` marker is never trusted."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MARKER = "COMPLETE"
DAMAGED = ".damaged-"  # `<step>/.damaged-<key>-<time>`: an entry that no longer reads, set aside

log = logging.getLogger(__name__)


def entry_dir(cache_dir: str | Path, step: str, key: str) -> Path:
    return Path(cache_dir) / step / key


def is_complete(path: str | Path) -> bool:
    return (Path(path) / MARKER).is_file()


def read_reference(path: str | Path) -> dict[str, Any] | None:
    marker = Path(path) / MARKER
    if not marker.is_file():
        return None
    try:
        return json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return None


@contextmanager
def writing(final: str | Path):
    """Yield a temporary folder; on success it replaces `final` whole. On error it is removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def set_aside_damaged(path: str | Path, why: str) -> Path:
    """Move a complete-marked entry that no longer reads (truncated by a full disk, a cut copy) to a sibling
    `.damaged-<name>-<time>` folder by one rename, with a warning naming it: never loaded, never deleted."""
    path = Path(path)
    aside = path.with_name(f"{DAMAGED}{path.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}")
    os.replace(path, aside)
    log.warning("cache entry '%s' is damaged (%s): moved to '%s'; it will be built again", path, why, aside)
    return aside


def cached_step(cache_dir: str | Path, step: str, key: str, build: Callable[[Path], dict[str, Any]],
                refresh: bool = False, location: str | Path | None = None) -> dict[str, Any]:
    """The stored reference for (step, key), built by `build(folder)` on a miss; it gains `path` and `fingerprint`."""
    final = Path(location) if location else entry_dir(cache_dir, step, key)
    if not refresh:
        ref = read_reference(final)
        if ref is not None and ref.get("fingerprint") == key:
            return {**ref, "path": str(final), "cache_hit": True}
    with writing(final) as tmp:
        ref = dict(build(tmp))
        ref.update(fingerprint=key, step=step)
        (tmp / MARKER).write_text(json.dumps(ref, sort_keys=True, default=str))
    return {**ref, "path": str(final), "cache_hit": False}
