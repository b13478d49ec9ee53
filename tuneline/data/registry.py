"""dataset_info.json: LLaMA-Factory's dataset registry, read into `DatasetAttr` with its defaults.

As in LLaMA-Factory, column defaults hold only for an entry without "columns". Free of heavy imports: the
fingerprint reads it on every run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneline.errors import DataError, did_you_mean

INFO_FILE = "dataset_info.json"
FORMATS = ("alpaca", "sharegpt")
COLUMN_KEYS = ("prompt", "query", "response", "history", "messages", "system", "tools", "chosen", "rejected",
               "kto_tag", "images", "videos")
TAG_KEYS = ("role_tag", "content_tag", "user_tag", "assistant_tag", "observation_tag", "function_tag", "system_tag")
SOURCE_KEYS = ("file_name", "hf_hub_url")
# Every key an entry may hold; `file_sha1` is a checksum LLaMA-Factory no longer checks, and neither do we.
ENTRY_KEYS = (*SOURCE_KEYS, "formatting", "ranking", "subset", "split", "revision", "num_samples", "columns", "tags",
              "file_sha1")
UNSUPPORTED_COLUMNS = {  # LLaMA-Factory's column keys tuneline does not implement, and what to do instead
    "audios": "audio is not supported; remove the column and its <audio> placeholders, or train audio models "
              "with LLaMA-Factory",
}
NOT_SUPPORTED = {  # LLaMA-Factory's entry keys that tuneline does not implement, and what to do instead
    "ms_hub_url": "download the ModelScope dataset and name the file with 'file_name'",
    "om_hub_url": "download the Modelers dataset and name the file with 'file_name'",
    "script_url": "save the data as JSON, JSONL, CSV or Parquet and name it with 'file_name'",
    "cloud_file_name": "download the file and name it with 'file_name'",
    "folder": "use 'subset', or download the folder and name it with 'file_name'",
}


@dataclass
class DatasetAttr:
    name: str
    source: str  # "file" or "hf_hub"
    location: str  # file/folder path, or hub id (or a local save_to_disk folder)
    formatting: str = "alpaca"
    ranking: bool = False
    subset: str | None = None
    split: str = "train"
    revision: str | None = None
    num_samples: int | None = None
    # columns (alpaca defaults; sharegpt uses messages)
    prompt: str | None = "instruction"
    query: str | None = "input"
    response: str | None = "output"
    history: str | None = None
    messages: str | None = "conversations"
    system: str | None = None
    tools: str | None = None
    chosen: str | None = None
    rejected: str | None = None
    kto_tag: str | None = None
    images: str | None = None  # media columns: file paths per row (see media.py)
    videos: str | None = None
    # sharegpt tags
    role_tag: str = "from"
    content_tag: str = "value"
    user_tag: str = "human"
    assistant_tag: str = "gpt"
    observation_tag: str = "observation"
    function_tag: str = "function_call"
    system_tag: str = "system"
    entry: dict | None = None  # the raw dataset_info entry, part of the fingerprint

    def path(self, dataset_dir: str | Path) -> Path:
        return resolve(dataset_dir, self.location)


def resolve(dataset_dir: str | Path, location: str) -> Path:
    path = Path(location).expanduser()
    return path if path.is_absolute() else Path(dataset_dir) / path


def read_info(dataset_dir: str | Path) -> dict[str, Any]:
    path = Path(dataset_dir) / INFO_FILE
    if not path.is_file():
        raise DataError(f"'dataset_dir' has no {INFO_FILE}: '{path}' does not exist")
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"'{path}' is not valid JSON: {exc}") from None
    if not isinstance(info, dict):
        raise DataError(f"'{path}' must map dataset names to entries, not {type(info).__name__}")
    return info


def dataset_attrs(names: list[str], dataset_dir: str | Path) -> list[DatasetAttr]:
    """The registry entries for `names`, every unknown name or bad entry reported at once."""
    if not names:
        return []
    info = read_info(dataset_dir)
    attrs, problems = [], []
    for name in names:
        if name not in info:
            problems.append(f"dataset '{name}' is not in {Path(dataset_dir) / INFO_FILE}{did_you_mean(name, info)}")
            continue
        try:
            attrs.append(parse_entry(name, info[name]))
        except DataError as exc:
            problems += exc.problems
            continue
        if hub_media_problem := remote_media_problem(attrs[-1], dataset_dir):
            problems.append(hub_media_problem)
    if problems:
        raise DataError(problems)
    return attrs


def has_media_columns(attr: DatasetAttr) -> bool:
    return bool(attr.images or attr.videos)


def remote_media_problem(attr: DatasetAttr, dataset_dir: str | Path) -> str | None:
    """Why a hub entry with media columns cannot be read: media are files on disk, so its rows must be there too,
    in `dataset_dir/<hub id>` (where a hub entry's local copy is looked for first) -- None when they are."""
    if attr.source != "hf_hub" or not has_media_columns(attr) or attr.path(dataset_dir).exists():
        return None
    return (f"dataset '{attr.name}': images and videos of a hub dataset ('hf_hub_url: {attr.location}') are not "
            f"read from the hub; put its rows (JSON naming image files) in the folder '{attr.path(dataset_dir)}', "
            "which this entry then reads, or name a local file with 'file_name'")


def parse_entry(name: str, entry: Any) -> DatasetAttr:
    if not isinstance(entry, dict):
        raise DataError(f"dataset '{name}': entry must be a JSON object, not {type(entry).__name__}")
    sources = [k for k in SOURCE_KEYS if k in entry]
    if not sources:
        extra = " (ms_hub_url/script_url are not supported)" if {"ms_hub_url", "script_url"} & set(entry) else ""
        raise DataError(f"dataset '{name}': needs 'file_name' or 'hf_hub_url'{extra}")
    source = "hf_hub" if "hf_hub_url" in entry else "file"
    location = str(entry["hf_hub_url" if source == "hf_hub" else "file_name"])
    attr = DatasetAttr(name=name, source=source, location=location, entry=entry)
    problems = [f"dataset '{name}': '{key}' is not supported: {NOT_SUPPORTED[key]}" if key in NOT_SUPPORTED else
                f"dataset '{name}': unknown key '{key}'{did_you_mean(key, ENTRY_KEYS)}"
                for key in entry if key not in ENTRY_KEYS]
    for key in ("formatting", "ranking", "subset", "split", "revision", "num_samples"):
        if entry.get(key) is not None:
            setattr(attr, key, entry[key])
    if attr.formatting not in FORMATS:
        problems.append(f"dataset '{name}': formatting '{attr.formatting}' is not one of {list(FORMATS)}")
    for group, keys in (("columns", COLUMN_KEYS), ("tags", TAG_KEYS)):
        mapping = entry.get(group) or {}
        if not isinstance(mapping, dict):
            problems.append(f"dataset '{name}': '{group}' must be a JSON object")
            continue
        if group == "columns" and group in entry:  # as in LLaMA-Factory: listing columns unsets the unlisted ones
            for key in COLUMN_KEYS:
                setattr(attr, key, None)
        for key, value in mapping.items():
            if group == "columns" and key in UNSUPPORTED_COLUMNS:
                problems.append(f"dataset '{name}': columns key '{key}': {UNSUPPORTED_COLUMNS[key]}")
            elif key not in keys:
                problems.append(f"dataset '{name}': unknown {group} key '{key}'{did_you_mean(key, keys)}")
            else:
                setattr(attr, key, value)
    if problems:
        raise DataError(problems)
    return attr

