"""Registered datasets -> one mixed `datasets.Dataset` of standard examples, bad rows caught first.

Datasets are sampled, then concatenated or interleaved as LLaMA-Factory mixes them."""

from __future__ import annotations

import logging
import random
from collections import Counter
from dataclasses import dataclass, field

from tuneline.config.run_config import RunConfig
from tuneline.data.cache_key import seed_of
from tuneline.data.converters import check_stage, convert_rows
from tuneline.data.media import media_root
from tuneline.data.readers import BadRow, Row, read_rows
from tuneline.data.registry import dataset_attrs
from tuneline.errors import ConfigError, DataError

log = logging.getLogger("tuneline.data")
STOPPING = {"interleave_under": "first_exhausted", "interleave_over": "all_exhausted"}


@dataclass
class Loaded:
    per_dataset: list[list[dict]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    bad: list[BadRow] = field(default_factory=list)


def sample_rows(rows: list[Row], num_samples: int | None, max_samples: int | None, seed: int) -> list[Row]:
    """`num_samples`: a seeded sample (repeating rows when larger); `max_samples`: the first n."""
    if num_samples is not None:
        rng = random.Random(seed)
        order = list(range(len(rows)))
        rng.shuffle(order)
        picks = order[:num_samples]
        if num_samples > len(rows) and rows:
            picks += [rng.randrange(len(rows)) for _ in range(num_samples - len(rows))]
        rows = [rows[i] for i in picks]
    return rows[:max_samples] if max_samples is not None else rows


def load_examples(config: RunConfig, names: list[str]) -> Loaded:
    data, out = config.data, Loaded()
    for attr in dataset_attrs(names, data.dataset_dir):
        check_stage(attr, config.stage)
        rows, bad = read_rows(attr, data.dataset_dir, config.model.cache_dir)
        rows = sample_rows(rows, attr.num_samples, data.max_samples, seed_of(config))
        examples, bad_converted = convert_rows(attr, rows, config.stage, media_root(data))
        out.per_dataset.append(examples)
        out.names.append(attr.name)
        out.bad += bad + bad_converted
    return out


def bad_row_error(bad: list[BadRow]) -> DataError:
    first, others = bad[0], Counter(b.reason for b in bad[1:])
    more = ""
    if others:
        counts = ", ".join(f"{reason} {n}" for reason, n in others.most_common())
        more = f" ({sum(others.values())} other bad rows: {counts})"
    return DataError(f"{first.message()}{more}; fix the data, or set on_bad_rows: skip to drop bad rows")


def handle_bad_rows(bad: list[BadRow], policy: str) -> dict[str, int]:
    if bad and policy != "skip":
        raise bad_row_error(bad)
    counts = dict(Counter(b.reason for b in bad))
    if counts:
        log.warning("dropped %d bad rows: %s", len(bad), counts)
    return counts


def mix(config: RunConfig, loaded: Loaded):
    """One Dataset of standard examples from several, concatenated or interleaved."""
    from datasets import Dataset, concatenate_datasets, interleave_datasets

    empty = [n for n, ex in zip(loaded.names, loaded.per_dataset, strict=True) if not ex]
    if len(empty) == len(loaded.names):
        raise DataError(f"dataset {', '.join(loaded.names)} has no usable rows "
                        f"({len(loaded.bad)} bad rows dropped); check the files and their dataset_info entries")
    parts = [Dataset.from_list(ex) for ex in loaded.per_dataset if ex]
    strategy = config.data.mix_strategy
    if len(parts) == 1 or strategy == "concat":
        return parts[0] if len(parts) == 1 else concatenate_datasets(parts)
    probs = _probabilities(config.data.interleave_probs, len(parts))
    return interleave_datasets(parts, probabilities=probs, seed=seed_of(config), stopping_strategy=STOPPING[strategy])


def _probabilities(text: str | None, count: int) -> list[float] | None:
    if not text:
        return None
    try:
        probs = [float(p) for p in text.split(",")]
    except ValueError:
        raise ConfigError(f"'interleave_probs: {text}' must be comma-separated numbers") from None
    if len(probs) != count or abs(sum(probs) - 1) > 1e-6:
        raise ConfigError(f"'interleave_probs: {text}' needs {count} numbers (one per non-empty dataset) summing to 1")
    return probs
