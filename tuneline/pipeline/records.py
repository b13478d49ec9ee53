"""Typed step results passed between the flow's tasks and persisted by Prefect's result store.

A field read that does not exist is then an AttributeError in any test that takes the path, and a type checker's
error before that, instead of a `KeyError` a user meets at run time. Mappings (MLflow params, JSON, artifacts) are
made from the fields explicitly with `to_dict()`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TrainResult:
    """The train step's small reference to a finished training in `output_dir`: the key it stands for, the
    final metrics, the MLflow run it reported to, and the resume key (what the weights depend on)."""

    output_dir: str
    train_key: str
    metrics: dict[str, float] = field(default_factory=dict)
    mlflow_run_id: str | None = None
    resume_key: str | None = None

    @property
    def path(self) -> Path:
        return Path(self.output_dir)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_stored(cls, value: TrainResult | dict[str, Any]) -> TrainResult:
        """A cached train result, also one stored as a plain dict by an earlier tuneline (its keys are this
        record's fields): the same reference, typed. Anything else is refused by name."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict) and value.get("output_dir") and value.get("train_key"):
            return cls(output_dir=str(value["output_dir"]), train_key=value["train_key"],
                       metrics=dict(value.get("metrics") or {}), mlflow_run_id=value.get("mlflow_run_id"),
                       resume_key=value.get("resume_key"))
        raise TypeError(f"not a train step result: {value!r}")


@dataclass(frozen=True)
class MlflowRun:
    """The MLflow run a flow records into: where its store is, how to open it in the UI, and (for a fine-tuning
    run) the keys it was found by. Steps take it to log into that run; it is part of no step's content key."""

    run_id: str
    tracking_uri: str
    url: str | None = None
    ui_command: str | None = None
    run_key: str | None = None
    work_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
