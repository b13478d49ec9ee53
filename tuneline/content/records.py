"""Typed results of the content-cached steps, as the flow's tasks pass them on and Prefect's result store keeps them.

A field read that does not exist is then an AttributeError in any test that takes the path, and a type checker's
error before that, instead of a `KeyError` a user meets at run time. Each step's library side stores its result as
JSON in its cache folder; `from_stored` reads that form (and the same dict a Prefect result store kept from an
earlier tuneline), naming what is missing. Mappings (MLflow, JSON, artifacts) are made with `to_dict()`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

Record = TypeVar("Record", bound="StepRecord")


class StepRecord:
    """What every step record shares: built from its stored form, turned back into a plain mapping."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_stored(cls: type[Record], value: Record | dict[str, Any]) -> Record:
        """This record, or the plain dict a step stored (keys named as the fields; others, such as a cache entry's
        own bookkeeping, are left out). A dict without a required field is refused, naming the field."""
        if isinstance(value, cls):
            return value
        fields = dataclasses.fields(cls)
        if isinstance(value, dict):
            missing = [f.name for f in fields if f.name not in value and f.default is dataclasses.MISSING
                       and f.default_factory is dataclasses.MISSING]
            if not missing:
                return cls(**{f.name: value[f.name] for f in fields if f.name in value})
            raise TypeError(f"not a stored {cls.__name__}: no {', '.join(missing)} in {value!r}")
        raise TypeError(f"not a stored {cls.__name__}: {value!r}")


@dataclass(frozen=True)
class TokenizerInfo(StepRecord):
    """load-tokenizer: the tokenizer loaded once, to prove it works; later steps get this, never the object."""

    path: str
    fingerprint: str
    vocab_size: int
    has_chat_template: bool = False
    eos_token: str | None = None
    pad_token: str | None = None


@dataclass(frozen=True)
class BuiltDataset(StepRecord):
    """build-dataset: the processed splits in `path`, their content key, and what the build counted."""

    path: str
    fingerprint: str
    stage: str | None = None
    train_rows: int | None = None  # None: not counted (a reference made by hand, a folder named to the child)
    eval_rows: int | None = None
    bad_rows: dict[str, int] = field(default_factory=dict)  # dropped rows, by reason (`on_bad_rows: skip`)
    truncated_rows: int = 0
    tokens: int = 0
    cache_hit: bool = False


@dataclass(frozen=True)
class ReferenceLogps(StepRecord):
    """build-reference-model: the dataset with the reference model's log-probs in `path`, or why none is needed."""

    fingerprint: str
    needed: bool
    path: str | None = None
    reason: str | None = None  # why none is needed
    computed_rows: int = 0
    cache_hit: bool = False

    def training_data(self, dataset: BuiltDataset) -> str:
        """The dataset the child trains on: this step's copy (with the log-probs) when it made one."""
        return self.path if self.needed and self.path else dataset.path


@dataclass(frozen=True)
class Evaluation(StepRecord):
    """evaluate: one model's metrics on the validation split, and the cache folder holding its answers."""

    fingerprint: str
    metrics: dict[str, float] = field(default_factory=dict)
    num_samples: int = 0
    path: str | None = None
    skipped: str | None = None  # why there are no metrics (no validation split)
    num_generated: int = 0
    model_key: str | None = None
    adapter_dir: str | None = None
    cache_hit: bool = False


@dataclass(frozen=True)
class Prediction(StepRecord):
    """predict: the answers and scores of `do_predict`, cached in `path` and copied into `output_dir`."""

    fingerprint: str
    path: str
    output_dir: str
    metrics: dict[str, float] = field(default_factory=dict)
    num_samples: int = 0
    model_key: str | None = None
    cache_hit: bool = False
