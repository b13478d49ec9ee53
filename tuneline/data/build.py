"""The build-dataset step: load, check, convert, tokenize and store, keyed by content.

A `tokenized_path` holding an entry built from other inputs is an error that lists what changed, never silently
reused. Bad rows are found in two passes: row checks while reading stop the build before anything is tokenized;
checks that need token counts come after. `on_bad_rows: skip` drops both kinds and counts them per reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tuneline.config.run_config import RunConfig
from tuneline.content.fingerprint import fingerprint
from tuneline.content.records import BuiltDataset
from tuneline.content.step_cache import cached_step, entry_dir, is_complete, read_reference, set_aside_damaged
from tuneline.data.cache_key import describe_changes, fingerprint_inputs, seed_of
from tuneline.data.loader import bad_row_error, handle_bad_rows, load_examples, mix
from tuneline.data.processors import CHECK_COLUMNS, TRUNCATED, Encoder
from tuneline.data.readers import BadRow
from tuneline.errors import DataError

STEP = "build-dataset"
INPUTS_FILE = "fingerprint_inputs.json"


def build_dataset(config: RunConfig) -> dict[str, Any]:
    """The step's result as a dict: the fields of its record (BuiltDataset)."""
    inputs = fingerprint_inputs(config)
    key = fingerprint(inputs)
    location = config.data.tokenized_path
    refresh = config.data.overwrite_cache or config.pipeline.refresh_cache
    if not refresh:
        usable_entry(location or entry_dir(config.pipeline.pipeline_cache_dir, STEP, key))
    if location and not refresh:
        check_tokenized_path(Path(location), key, inputs)
    ref = cached_step(config.pipeline.pipeline_cache_dir, STEP, key, lambda folder: _build(config, folder, inputs),
                      refresh=refresh, location=location)
    return BuiltDataset.from_stored(ref).to_dict()  # the step's record, less the cache entry's bookkeeping


def damaged_file(location: Path) -> str | None:
    """Why a complete-marked dataset entry would not load (naming its first unreadable file), or None."""
    from datasets import Dataset, load_from_disk

    for path in sorted(location.rglob("*.arrow")):
        try:
            Dataset.from_file(str(path))
        except (OSError, ValueError) as err:
            return f"{path.relative_to(location)} does not read: {err}"
    try:
        load_from_disk(str(location))
    except (OSError, ValueError, KeyError) as err:
        return f"it does not load: {err}"
    return None


def usable_entry(location: str | Path) -> bool:
    """True when `location` holds a complete entry that loads; a complete one that does not is set aside."""
    location = Path(location)
    if not is_complete(location):
        return False
    why = damaged_file(location)
    if why is None:
        return True
    set_aside_damaged(location, why)
    return False


def check_tokenized_path(location: Path, key: str, inputs: dict[str, Any]) -> None:
    if not location.exists() or (location.is_dir() and not any(location.iterdir())):
        return
    ref = read_reference(location)
    if ref is None:
        raise DataError(f"tokenized_path '{location}' exists but is not a complete tuneline dataset entry; "
                        "remove it, point tokenized_path elsewhere, or set overwrite_cache: true")
    if ref.get("fingerprint") == key:
        return
    try:
        old = json.loads((location / INPUTS_FILE).read_text())
        changes = describe_changes(old, inputs)
    except (OSError, json.JSONDecodeError):
        changes = ["(the entry does not record its inputs)"]
    raise DataError(f"tokenized_path '{location}' was built from different inputs: {'; '.join(changes)}. "
                    "Set overwrite_cache: true to rebuild it, or point tokenized_path elsewhere")


def _encode(config: RunConfig, dataset, tokenizer, template) -> tuple[Any, list[BadRow], int]:
    """The encoded dataset without the rows tokenization showed to be unusable, those rows, and how many examples
    lost tokens to cutoff_len."""
    from tuneline.data.mm.run_media import has_media, run_media

    data = config.data
    media = None
    if has_media(dataset):
        media = run_media(config, tokenizer, template, has_media(dataset, ("videos",)))
    encoder = Encoder(tokenizer, template, config.stage, data.cutoff_len, data.train_on_prompt, data.mask_history,
                      config.effective_packing, media)
    workers = data.preprocessing_num_workers if (data.preprocessing_num_workers or 1) > 1 else None
    encoded = dataset.map(encoder, batched=True, batch_size=data.preprocessing_batch_size, num_proc=workers,
                          remove_columns=dataset.column_names, load_from_cache_file=False,
                          desc=f"encoding for {config.stage}")
    encoded, bad = drop_problem_rows(encoded)
    truncated = sum(encoded[TRUNCATED]) if TRUNCATED in encoded.column_names else 0  # of the rows kept
    return encoded.remove_columns([c for c in encoded.column_names if c == TRUNCATED]), bad, truncated


def drop_problem_rows(encoded) -> tuple[Any, list[BadRow]]:
    """Split off rows whose `_problem` is set (see processors.CHECK_COLUMNS) as bad rows."""
    if "_problem" not in encoded.column_names:
        return encoded, []
    problems = encoded.data.column("_problem").to_pylist()
    bad_indices = [i for i, problem in enumerate(problems) if problem]
    bad = []
    if bad_indices:
        where = encoded.select(bad_indices).select_columns(list(CHECK_COLUMNS)).to_list()
        for row in where:
            reason, _, detail = row["_problem"].partition(": ")
            bad.append(BadRow(row["_file"], row["_row"], reason, detail=detail))
        dropped = set(bad_indices)
        encoded = encoded.select([i for i in range(len(encoded)) if i not in dropped])
    return encoded.remove_columns(list(CHECK_COLUMNS)), bad


def _split(config: RunConfig, train, evaluation):
    from datasets import DatasetDict

    val = config.data.val_size or 0
    if evaluation is None and val > 0:
        size = int(val) if val >= 1 else float(val)
        if (isinstance(size, int) and size >= len(train)) or len(train) < 2:
            raise DataError(f"val_size {val} leaves no training rows out of {len(train)}; lower it")
        parts = train.train_test_split(test_size=size, seed=seed_of(config))
        train, evaluation = parts["train"], parts["test"]
    splits = {"train": train} if train is not None else {}
    if evaluation is not None:
        splits["validation"] = evaluation
    return DatasetDict(splits)


def _build(config: RunConfig, folder: Path, inputs: dict[str, Any]) -> dict[str, Any]:
    from tuneline.data.template_catalog import run_template
    from tuneline.model.tokenizer import load_tokenizer

    train_loaded = load_examples(config, config.dataset_names)  # none for a prediction without training
    eval_loaded = load_examples(config, config.eval_dataset_names) if config.eval_dataset_names else None
    bad = train_loaded.bad + (eval_loaded.bad if eval_loaded else [])
    if bad and config.data.on_bad_rows != "skip":  # row checks stop before anything is tokenized
        raise bad_row_error(bad)
    tokenizer = load_tokenizer(config.model)
    template = run_template(config.data, tokenizer)
    train, train_bad, truncated = (_encode(config, mix(config, train_loaded), tokenizer, template)
                                   if train_loaded.names else (None, [], 0))
    evaluation, eval_bad = None, []
    if eval_loaded:
        evaluation, eval_bad, eval_truncated = _encode(config, mix(config, eval_loaded), tokenizer, template)
        truncated += eval_truncated
    bad_counts = handle_bad_rows(bad + train_bad + eval_bad, config.data.on_bad_rows)
    for what, split in (("dataset", train), ("eval_dataset", evaluation)):
        if split is not None and len(split) == 0:
            raise DataError(f"{what} {getattr(config.data, what)} is empty after encoding for stage "
                            f"'{config.stage}' (bad rows dropped: {bad_counts or 'none'})")
    splits = _split(config, train, evaluation)
    splits.save_to_disk(str(folder))
    (folder / INPUTS_FILE).write_text(json.dumps(inputs, sort_keys=True, default=str))
    return {"stage": config.stage, "train_rows": len(splits["train"]) if "train" in splits else 0,
            "eval_rows": len(splits["validation"]) if "validation" in splits else 0,
            "bad_rows": bad_counts, "truncated_rows": truncated,
            "tokens": count_tokens(splits["train"]) if "train" in splits else 0}


def count_tokens(dataset) -> int:
    """Non-pad tokens of a processed split (rows are unpadded, so lengths are token counts)."""
    import pyarrow.compute as pc

    columns = [c for c in ("input_ids", "chosen_input_ids", "rejected_input_ids") if c in dataset.column_names]
    total = 0
    for column in columns:
        lengths = pc.list_value_length(dataset.data.column(column))
        if dataset._indices is not None:  # a split view: count only its rows
            lengths = pc.take(lengths, dataset._indices.column(0))
        total += pc.sum(lengths).as_py() or 0
    return int(total)


def with_lengths(dataset, column: str = "length"):
    """The split with a `length` column (longest ids column per row) for `group_by_length`: transformers infers
    lengths only from `input_ids`, row by row, and fails on pairwise data that has none."""
    import pyarrow.compute as pc

    columns = [c for c in dataset.column_names if c.endswith("input_ids")]
    if not columns or column in dataset.column_names:
        return dataset
    lengths = None
    for name in columns:
        values = pc.list_value_length(dataset.data.column(name))
        if dataset._indices is not None:
            values = pc.take(values, dataset._indices.column(0))
        lengths = values if lengths is None else pc.max_element_wise(lengths, values)
    return dataset.add_column(column, lengths.to_pylist())


def load_processed(ref_or_path: BuiltDataset | dict[str, Any] | str | Path):
    """The `DatasetDict` ("train", and "validation" when there is evaluation data) of a built entry: named by the
    step's record, the stored dict form the training child reads, or its folder."""
    from datasets import load_from_disk

    if isinstance(ref_or_path, BuiltDataset):
        ref_or_path = ref_or_path.path
    path = Path(ref_or_path["path"] if isinstance(ref_or_path, dict) else ref_or_path)
    if read_reference(path) is None:
        raise DataError(f"'{path}' is not a complete processed dataset; run the build-dataset step again")
    return load_from_disk(str(path))
