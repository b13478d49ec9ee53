"""A flow whose `train` step is cached as the real one is (content key, persisted to a result folder), for
test_step_records: `python stored_train_flow.py FOLDER record|dict` stores a result the way this or an earlier
tuneline did, in its own process."""

from __future__ import annotations

import sys
from pathlib import Path

from prefect import flow, task

from tasks.caching import content_key
from tuneline.pipeline.records import TrainResult

KEY = "stored-train-result-key"
FIELDS = {"output_dir": "/runs/a", "train_key": KEY, "metrics": {"train_loss": 1.5}, "mlflow_run_id": "run-1",
          "resume_key": "resume-1"}


@task(name="train", persist_result=True, cache_key_fn=content_key(lambda stored_as: KEY))
def stored_train(stored_as: str):
    if stored_as == "record":
        return TrainResult(**FIELDS)
    if stored_as == "dict":  # the form tuneline stored before its step results were records
        return dict(FIELDS)
    raise AssertionError("the step ran: a stored result was expected")


@flow(name="stored-train")
def run_stored_train(folder: str, stored_as: str) -> TrainResult:
    return TrainResult.from_stored(stored_train.with_options(result_storage=Path(folder))(stored_as))


if __name__ == "__main__":
    run_stored_train(sys.argv[1], sys.argv[2])
