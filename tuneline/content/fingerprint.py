"""Content fingerprints: the one way every cached step computes its key.

File hashes are remembered by (path, size, mtime) in a small JSON memo so a large dataset is not re-read on every run.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20
_MEMO_NAME = "file_hashes.json"
MEMO_DIR = "file-hashes"


def memo_dir(config) -> Path:
    """The file-hash memo of a run's cache: one for every step keyed on file contents, so each file is read once."""
    return Path(config.pipeline.pipeline_cache_dir) / MEMO_DIR


def fingerprint(*parts: Any) -> str:
    """sha256 of the canonical JSON of `parts` (dict keys sorted, paths as strings)."""
    text = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class FileHasher:
    """Streams files through sha256 and remembers results by (path, size, mtime_ns)."""

    def __init__(self, memo_dir: str | Path | None = None):
        self.memo_path = Path(memo_dir) / _MEMO_NAME if memo_dir else None
        self._memo: dict[str, list] = {}
        self._dirty = False
        if self.memo_path and self.memo_path.is_file():
            try:
                self._memo = json.loads(self.memo_path.read_text())
            except (OSError, json.JSONDecodeError):
                self._memo = {}

    def hash_file(self, path: str | Path) -> str:
        path = Path(path).resolve()
        stat = path.stat()
        stamp = [stat.st_size, stat.st_mtime_ns]
        known = self._memo.get(str(path))
        if known and known[:2] == stamp:
            return known[2]
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
        self._memo[str(path)] = [*stamp, digest.hexdigest()]
        self._dirty = True
        return digest.hexdigest()

    def hash_tree(self, root: str | Path) -> dict[str, str]:
        """{relative path: hash} of every file under root (or root itself when it is a file)."""
        root = Path(root)
        if root.is_file():
            return {root.name: self.hash_file(root)}
        files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
        return {str(p.relative_to(root)): self.hash_file(p) for p in files}

    def save(self) -> None:
        if not (self.memo_path and self._dirty):
            return
        self.memo_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.memo_path.with_name(f".{_MEMO_NAME}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self._memo))
        os.replace(tmp, self.memo_path)
        self._dirty = False
