"""Helpers the data tests import: ids of the char tokenizer, dataset folders (fixtures: tests.support.data_fixtures)."""

from __future__ import annotations

import json
from pathlib import Path

PAD, BOS, EOS = 0, 1, 2


def ids(text: str) -> list[int]:
    """Hand-computable ids of the char tokenizer."""
    return [ord(c) for c in text]


def masked(text: str) -> list[int]:
    return [-100] * len(text)


def write_dataset(root: Path, name: str, rows, entry: dict | None = None, file_name: str | None = None) -> Path:
    """Write rows (list -> .json array, str -> raw text) and register them in root/dataset_info.json."""
    root.mkdir(parents=True, exist_ok=True)
    file_name = file_name or f"{name}.json"
    path = root / file_name
    if isinstance(rows, bytes):
        path.write_bytes(rows)
    elif isinstance(rows, str):
        path.write_text(rows, encoding="utf-8")
    elif file_name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        path.write_text(json.dumps(rows), encoding="utf-8")
    info_path = root / "dataset_info.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    info[name] = {"file_name": file_name, **(entry or {})}
    info_path.write_text(json.dumps(info, indent=1))
    return path
