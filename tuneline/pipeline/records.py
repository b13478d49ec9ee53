"""Typed records of the train step and of the MLflow run, passed between the flow's tasks and persisted by Prefect's
result store (the content-cached steps' records: tuneline.content.records, with the same `from_stored`/`to_dict`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tuneline.content.records import StepRecord


@dataclass(frozen=True)
class TrainResult(StepRecord):
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


@dataclass(frozen=True)
class MlflowRun(StepRecord):
    """The MLflow run a flow records into: where its store is, how to open it in the UI, and (for a fine-tuning
    run) the keys it was found by. Steps take it to log into that run; it is part of no step's content key."""

    run_id: str
    tracking_uri: str
    url: str | None = None
    ui_command: str | None = None
    run_key: str | None = None
    work_key: str | None = None
