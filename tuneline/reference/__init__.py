"""`build-reference-model`: run the reference model once per row and store its log-probs beside the processed data.

Running a frozen reference on every batch of every run doubles the cost. Only the rows the run will visit are
computed (`rows.py`; the others hold NaN, which the trainer refuses), and rows are kept across runs (`store.py`).
Nothing that only shapes training (`pref_beta`, sigmoid/hinge/ipo, `learning_rate`) is in the key, so a sweep over
those reuses one entry; ipo's per-token mean is taken at training time from the labels.

This package imports no torch until a build actually runs, so fingerprinting stays fast."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tuneline.content.code import step_code_version
from tuneline.content.fingerprint import FileHasher, fingerprint, memo_dir
from tuneline.content.records import BuiltDataset
from tuneline.content.step_cache import cached_step
from tuneline.objectives.losses import REFERENCE_FREE
from tuneline.reference.compute import REF_COLUMNS, TOKEN_COLUMNS
from tuneline.reference.rows import visit_plan, visited_rows
from tuneline.reference.source import load_reference_model, reference_config, reference_source, rows_key
from tuneline.reference.store import RowStore, row_digests, with_media

__all__ = ["REF_COLUMNS", "STEP", "TOKEN_COLUMNS", "build_reference_logps", "load_reference_model",
           "needs_reference", "not_needed_reason", "reference_config", "reference_fingerprint", "reference_source",
           "uses_reference"]

STEP = "build-reference-model"
ROWS_FOLDER = "rows"  # <pipeline_cache_dir>/build-reference-model/rows/<rows key>/: the per-row store


def uses_reference(config) -> bool:
    """Whether training compares the policy with a reference model at all (live or precomputed)."""
    ft = config.finetuning
    if ft.stage == "dpo":
        return ft.pref_loss not in REFERENCE_FREE
    return ft.stage == "kto"


def needs_reference(config) -> bool:
    """Whether the `build-reference-model` step precomputes anything for this config."""
    return uses_reference(config) and bool(config.finetuning.precompute_ref)


def not_needed_reason(config) -> str:
    ft = config.finetuning
    if ft.stage in ("grpo", "rloo"):
        return (f"stage '{ft.stage}' is online: the answers it scores are sampled while it trains, so there is nothing to "
                "precompute" + ("; trl runs the reference live (LoRA: the base with the adapter off)"
                                if config.grpo.beta else "; with beta 0 no reference is used"))
    if ft.stage not in REF_COLUMNS:
        return f"stage '{ft.stage}' trains without precomputed reference log-probs"
    if not uses_reference(config):
        return f"pref_loss '{ft.pref_loss}' uses no reference model"
    return "precompute_ref is false: the trainer runs the reference model live"


def reference_fingerprint(config, dataset_fingerprint: str) -> str:
    """Content key of the step's output (see the module docstring for what is in it)."""
    ft = config.finetuning
    if not needs_reference(config):
        return fingerprint("no-reference", config.stage, ft.pref_loss)
    hasher = FileHasher(memo_dir(config))
    reference = rows_key(config, hasher)
    code = step_code_version("build-reference-model")
    hasher.save()
    return fingerprint(STEP, reference, code, dataset_fingerprint, config.data.cutoff_len, config.data.template,
                       config.stage, visit_plan(config))


def build_reference_logps(config, dataset_ref: BuiltDataset | dict) -> dict[str, Any]:
    """Precompute the reference log-probs the run will read (cached); returns the stored dataset's reference."""
    dataset = BuiltDataset.from_stored(dataset_ref)
    if not needs_reference(config):
        return {"needed": False, "reason": not_needed_reason(config),
                "fingerprint": reference_fingerprint(config, dataset.fingerprint)}
    key = reference_fingerprint(config, dataset.fingerprint)
    ref = cached_step(config.pipeline.pipeline_cache_dir, STEP, key,
                      lambda folder: _build(config, dataset, folder), refresh=config.pipeline.refresh_cache)
    return {**ref, "needed": True}


def row_store(config) -> RowStore:
    """The per-row store of this config's reference."""
    hasher = FileHasher(memo_dir(config))
    folder = Path(config.pipeline.pipeline_cache_dir) / STEP / ROWS_FOLDER / rows_key(config, hasher)
    return RowStore(folder, REF_COLUMNS[config.stage])


def _build(config, built: BuiltDataset, folder: Path) -> dict[str, Any]:
    """Rows the run visits: from the row store, computing (and storing) the missing ones; the rest hold NaN."""
    from datasets import DatasetDict

    from tuneline.data import load_processed

    start = time.perf_counter()
    stage, datasets = config.stage, load_processed(built)
    store = row_store(config)
    known = {} if config.pipeline.refresh_cache else store.load()
    plan = visit_plan(config)
    digests = {}  # split -> {row: digest}, in visiting order
    hasher = FileHasher(memo_dir(config))
    for split, dataset in datasets.items():
        rows = visited_rows(plan, len(dataset)) if split == "train" else None  # evaluation reads every row
        rows = list(range(len(dataset))) if rows is None else rows
        named = with_media(row_digests(dataset, TOKEN_COLUMNS[stage], rows), dataset, rows, hasher.hash_file)
        digests[split] = dict(zip(rows, named, strict=True))
    hasher.save()
    computed, used = _compute_missing(config, datasets, digests, known)
    store.add(computed)
    known.update(computed)
    out = {}
    for split, dataset in datasets.items():
        columns = [[float("nan")] * len(dataset) for _ in REF_COLUMNS[stage]]
        for row, digest in digests[split].items():
            for column, value in zip(columns, known[digest], strict=True):
                column[row] = value
        for name, column in zip(REF_COLUMNS[stage], columns, strict=True):
            dataset = dataset.add_column(name, column)
        out[split] = dataset
    DatasetDict(out).save_to_disk(str(folder))
    return {"rows": {split: len(ds) for split, ds in out.items()},
            "visited_rows": {split: len(rows) for split, rows in digests.items()}, "computed_rows": len(computed),
            "columns": list(REF_COLUMNS[stage]), "plan": plan, "dataset_fingerprint": built.fingerprint,
            "source": reference_source(config), **used, "seconds": round(time.perf_counter() - start, 3)}


def _compute_missing(config, datasets, digests: dict[str, dict[int, bytes]], known: dict) -> tuple[dict, dict]:
    """({digest: values} for the wanted rows not in `known`, each distinct row once; where they were computed)."""
    from tuneline.reference.compute import compute_rows

    missing: dict[bytes, tuple[str, int]] = {}
    for split, rows in digests.items():
        for row, digest in rows.items():
            if digest not in known:
                missing.setdefault(digest, (split, row))
    if not missing:
        return {}, {"device": None, "threads": None}
    by_split: dict[str, list[int]] = {}
    for split, row in missing.values():
        by_split.setdefault(split, []).append(row)
    values, used = compute_rows(config, datasets, by_split)
    computed = {digests[split][row]: value for split, rows in by_split.items()
                for row, value in zip(rows, values[split], strict=True)}
    return computed, used
