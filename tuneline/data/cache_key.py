"""The content key of a processed dataset, computed without heavy imports (it runs on every run).

The version of the code the step runs is part of the key (every module it imports), so editing how rows are read or
encoded rebuilds the data; a hub
dataset is keyed by the commit its revision resolves to, so a moved `main` rebuilds too. The images and videos a
dataset names are keyed by content, so an edited image rebuilds; which files a data file names is remembered by the
data file's hash, so a re-run does not parse it again."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tuneline.config.run_config import RunConfig
from tuneline.content.code import step_code_version
from tuneline.content.fingerprint import FileHasher, fingerprint, memo_dir
from tuneline.data.media import MEDIA_KINDS, PLACEHOLDERS, MediaProblem, media_names, media_root, resolve_media
from tuneline.data.mm.run_media import MEDIA_SETTINGS
from tuneline.data.readers import read_rows
from tuneline.data.registry import INFO_FILE, DatasetAttr, dataset_attrs
from tuneline.errors import DataError
from tuneline.hub.revision import HubNaming, resolve_revision
from tuneline.model.tokenizer import tokenizer_fingerprint

OPTION_KEYS = (
    "template", "cutoff_len", "train_on_prompt", "mask_history", "val_size", "max_samples", "mix_strategy",
    "interleave_probs", "default_system", "tool_format", "tool_date", "preprocessing_batch_size", "on_bad_rows",
    "enable_thinking", "preserve_thinking",
    "preprocessing_num_workers",  # workers shard the rows, so pt blocks and kto's mismatched pairs move
)


def seed_of(config: RunConfig) -> int:
    training = config.training
    return int(training.get("data_seed") or training.get("seed") or 42)


def _source_key(attr: DatasetAttr, dataset_dir: str, hasher: FileHasher) -> dict[str, Any]:
    path = attr.path(dataset_dir)
    if attr.source == "hf_hub" and not path.exists():
        naming = HubNaming(f"dataset '{attr.name}' ('hf_hub_url: {attr.location}' in {INFO_FILE})",
                           f"its 'revision' in {INFO_FILE}", "HF_TOKEN or `hf auth login`", DataError)
        commit = resolve_revision(attr.location, attr.revision, repo_type="dataset", naming=naming)
        return {"hub": attr.location, "revision": commit, "subset": attr.subset, "split": attr.split}
    if not path.exists():
        raise DataError(f"dataset '{attr.name}': file '{path}' does not exist")
    return {"files": hasher.hash_tree(path)}


def _named_media(attr: DatasetAttr, dataset_dir: str, known: dict[str, Any], memo: Path | None) -> list[list[str]]:
    """[kind, path as written] of every distinct medium the dataset's rows name (unusable cells are left to the
    build, which reports them), remembered under `known`: the data files' hashes and the code that reads them."""
    columns = {kind: getattr(attr, kind) for kind in MEDIA_KINDS if getattr(attr, kind)}
    memo_file = memo / f"{fingerprint(known, columns)}.json" if memo else None
    if memo_file and memo_file.is_file():
        try:
            return json.loads(memo_file.read_text())
        except (OSError, json.JSONDecodeError):
            pass
    named = set()
    for row in read_rows(attr, dataset_dir)[0]:
        for kind, column in columns.items():
            try:
                named.update((kind, name) for name in media_names(row.data.get(column), kind))
            except MediaProblem:
                continue
    found = sorted([kind, name] for kind, name in named)
    if memo_file:
        memo_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo_file.with_name(f".{memo_file.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(found))
        os.replace(tmp, memo_file)
    return found


def _media_key(attr: DatasetAttr, config: RunConfig, known: dict[str, Any], hasher: FileHasher) -> dict[str, Any]:
    """{absolute path: content hash, or "missing"} of the dataset's images and videos ({} for a text dataset)."""
    if not (attr.images or attr.videos):
        return {}
    memo = hasher.memo_path.parent / "media-names" if hasher.memo_path else None
    root = media_root(config.data)
    media = {}
    for _kind, name in _named_media(attr, config.data.dataset_dir, known, memo):
        path = resolve_media(name, root)
        if str(path) not in media:
            media[str(path)] = hasher.hash_file(path) if path.is_file() else "missing"
    return {"media": media}


def fingerprint_inputs(config: RunConfig) -> dict[str, Any]:
    """Everything the processed dataset depends on, as plain JSON (also stored, to explain a mismatch)."""
    data = config.data
    tokenizer = tokenizer_fingerprint(config.model, memo_dir(config))  # first: it saves the shared memo
    hasher = FileHasher(memo_dir(config))
    code = step_code_version("build-dataset")
    datasets = {}
    for role, names in (("train", config.dataset_names), ("eval", config.eval_dataset_names)):
        for attr in dataset_attrs(names, data.dataset_dir):
            source = _source_key(attr, data.dataset_dir, hasher)
            media = _media_key(attr, config, {"files": source.get("files"), "code": code}, hasher)
            datasets[f"{role}:{attr.name}"] = {"entry": attr.entry, **source, **media}
    hasher.save()
    options = {key: getattr(data, key) for key in OPTION_KEYS}
    options.update(packing=config.effective_packing, seed=seed_of(config), placeholders=PLACEHOLDERS)
    if any("media" in entry for entry in datasets.values()):  # they set how many tokens each image becomes
        options.update({key: getattr(config.model, key) for key in MEDIA_SETTINGS})
    return {"code": code, "stage": config.stage, "tokenizer": tokenizer, "options": options,
            "datasets": datasets, "dataset_order": [list(config.dataset_names), list(config.eval_dataset_names)]}


def dataset_fingerprint(config: RunConfig) -> str:
    return fingerprint(fingerprint_inputs(config))


def describe_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human lines naming what differs between two fingerprint inputs."""
    changes = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            for sub in sorted(set(a) | set(b)):
                if a.get(sub) != b.get(sub):
                    what = "content or entry" if key == "datasets" else f"{a.get(sub)!r} -> {b.get(sub)!r}"
                    changes.append(f"{key}.{sub}: {what}")
        elif key == "tokenizer":
            changes.append("tokenizer files changed")
        else:
            changes.append(f"{key}: {a!r} -> {b!r}")
    return changes
