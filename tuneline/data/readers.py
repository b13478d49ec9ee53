"""Read a registered dataset's rows, remembering where each came from so a bad row can be named.

Local files are read with the standard library (plus pyarrow for parquet) rather than `datasets`, so every
row keeps its file and row number and a broken line becomes one bad row instead of a failed load."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneline.data.registry import DatasetAttr, has_media_columns
from tuneline.errors import DataError

SUFFIXES = (".json", ".jsonl", ".csv", ".parquet", ".txt")
DISK_MARKERS = ("dataset_dict.json", "state.json")


@dataclass
class BadRow:
    file: str
    row: int
    reason: str  # short and countable: "missing column", "wrong type", "not JSON", ...
    column: str | None = None
    detail: str = ""

    def message(self) -> str:
        column = f", column '{self.column}'" if self.column else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.file}: row {self.row}{column}: {self.reason}{detail}"


@dataclass
class Row:
    file: str
    row: int
    data: dict[str, Any]


def is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in DISK_MARKERS)


def data_files(path: Path) -> list[Path]:
    """The data files of a file or folder source (one file, or every known data file in the folder)."""
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES and not p.name.startswith("."))
    if not files:
        raise DataError(f"folder '{path}' holds no data files ({', '.join(SUFFIXES)})")
    return files


def read_rows(attr: DatasetAttr, dataset_dir: str | Path,
              cache_dir: str | None = None) -> tuple[list[Row], list[BadRow]]:
    """Rows and bad rows of one registered dataset; `hf_hub_url` and `save_to_disk` folders go through `datasets`."""
    path = attr.path(dataset_dir)
    if is_saved_dataset(path):
        return _read_saved(attr, path), []
    if attr.source == "hf_hub" and not (has_media_columns(attr) and path.exists()):  # media rows: read as files
        return _read_hub(attr, str(path) if path.exists() else attr.location, cache_dir), []
    if not path.exists():
        raise DataError(f"dataset '{attr.name}': file '{path}' does not exist")
    rows, bad = [], []
    for file in data_files(path):
        reader = READERS.get(file.suffix)
        if reader is None:
            raise DataError(f"dataset '{attr.name}': '{file}' has an unknown type; use one of {', '.join(SUFFIXES)}")
        got_rows, got_bad = reader(file)
        rows += got_rows
        bad += got_bad
    return rows, bad


# --- local files
def _decode(file: Path) -> tuple[str, bool]:
    """Text of the file; invalid bytes survive as lone surrogates (flagged per row) instead of failing."""
    raw = file.read_bytes()
    try:
        return raw.decode("utf-8-sig"), True
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="surrogateescape"), False


def _has_bad_text(value: Any) -> bool:
    if isinstance(value, str):
        return any("\udc80" <= ch <= "\udcff" for ch in value)
    if isinstance(value, dict):
        return any(_has_bad_text(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_bad_text(v) for v in value)
    return False


def _collect(file: Path, items, clean: bool) -> tuple[list[Row], list[BadRow]]:
    rows, bad = [], []
    for number, item in items:
        if isinstance(item, BadRow):
            bad.append(item)
        elif not isinstance(item, dict):
            bad.append(BadRow(str(file), number, "wrong type", detail=f"a row must be an object, got {item!r:.40}"))
        elif not clean and _has_bad_text(item):
            bad.append(BadRow(str(file), number, "invalid UTF-8", detail="the row holds bytes that are not UTF-8"))
        else:
            rows.append(Row(str(file), number, item))
    return rows, bad


def _json_lines(file: Path, text: str):
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            yield number, BadRow(str(file), number, "not JSON", detail=f"{exc.msg} at column {exc.colno}")


def read_jsonl(file: Path):
    text, clean = _decode(file)
    return _collect(file, _json_lines(file, text), clean)


def read_json(file: Path):
    """A JSON array of rows; a file of one object per line is accepted too, as `datasets` does."""
    text, clean = _decode(file)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if text.lstrip().startswith("["):
            raise DataError(f"'{file}' is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        return _collect(file, _json_lines(file, text), clean)
    if isinstance(data, dict):
        return _collect(file, [(1, data)], clean)
    if not isinstance(data, list):
        raise DataError(f"'{file}' must hold a JSON array of rows, not {type(data).__name__}")
    return _collect(file, enumerate(data, start=1), clean)


def read_csv(file: Path):
    text, clean = _decode(file)
    reader = csv.DictReader(io.StringIO(text))
    return _collect(file, enumerate(reader, start=1), clean)


def read_txt(file: Path):
    text, clean = _decode(file)
    items = ((n, {"text": line}) for n, line in enumerate(text.splitlines(), start=1) if line.strip())
    return _collect(file, items, clean)


def read_parquet(file: Path):
    import pyarrow.parquet as pq

    table = pq.read_table(file)
    return _collect(file, enumerate(table.to_pylist(), start=1), True)


READERS = {".json": read_json, ".jsonl": read_jsonl, ".csv": read_csv, ".txt": read_txt, ".parquet": read_parquet}


# --- datasets library sources
def _rows_of(dataset, label: str) -> list[Row]:
    return [Row(label, i, item) for i, item in enumerate(dataset.to_list(), start=1)]


def _read_saved(attr: DatasetAttr, path: Path) -> list[Row]:
    from datasets import DatasetDict, load_from_disk

    data = load_from_disk(str(path))
    if isinstance(data, DatasetDict):
        if attr.split not in data:
            raise DataError(f"dataset '{attr.name}': split '{attr.split}' not in {sorted(data)} of '{path}'")
        data = data[attr.split]
    return _rows_of(data, str(path))


def _read_hub(attr: DatasetAttr, location: str, cache_dir: str | None) -> list[Row]:
    from datasets import load_dataset

    try:
        data = load_dataset(location, name=attr.subset, split=attr.split, revision=attr.revision, cache_dir=cache_dir)
    except Exception as exc:  # network, missing repo, bad split: the user fixes the entry or the connection
        raise DataError(f"dataset '{attr.name}': cannot load hub dataset '{location}' (subset {attr.subset!r}, "
                        f"split {attr.split!r}): {exc}") from None
    return _rows_of(data, location)
