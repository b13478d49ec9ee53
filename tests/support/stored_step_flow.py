"""A flow whose steps are cached as the real ones are (content key, persisted to a result folder), one per step
record, for test_step_records: `python stored_step_flow.py FOLDER record|dict` stores each step's result the way
this or an earlier tuneline did, in its own process."""

from __future__ import annotations

import sys
from pathlib import Path

from prefect import flow, task

from tasks.caching import content_key
from tuneline.content.records import BuiltDataset, Evaluation, Prediction, ReferenceLogps, TokenizerInfo
from tuneline.pipeline.records import MlflowRun, TrainResult

# Each record with every field set (none at its default), so that a field lost on the way shows.
FIELDS = {
    TokenizerInfo: {"path": "/models/tiny", "fingerprint": "tok-1", "vocab_size": 320, "has_chat_template": True,
                    "eos_token": "</s>", "pad_token": "<pad>"},
    BuiltDataset: {"path": "/cache/build-dataset/d-1", "fingerprint": "d-1", "stage": "sft", "train_rows": 9,
                   "eval_rows": 3, "bad_rows": {"empty answer": 2}, "truncated_rows": 1, "tokens": 420,
                   "cache_hit": True},
    ReferenceLogps: {"fingerprint": "r-1", "needed": True, "path": "/cache/build-reference-model/r-1",
                     "reason": "kept for the record", "computed_rows": 7, "cache_hit": True},
    TrainResult: {"output_dir": "/runs/a", "train_key": "t-1", "metrics": {"train_loss": 1.5},
                  "mlflow_run_id": "run-1", "resume_key": "resume-1"},
    Evaluation: {"fingerprint": "e-1", "metrics": {"eval_loss": 2.25}, "num_samples": 3, "path": "/cache/evaluate/e-1",
                 "skipped": "kept for the record", "num_generated": 3, "model_key": "m-1", "adapter_dir": "/runs/a",
                 "cache_hit": True},
    Prediction: {"fingerprint": "p-1", "path": "/cache/predict/p-1", "output_dir": "/runs/p",
                 "metrics": {"predict_bleu-4": 12.5}, "num_samples": 3, "model_key": "m-1", "cache_hit": True},
    MlflowRun: {"run_id": "run-1", "tracking_uri": "sqlite:///mlflow.db", "url": "http://127.0.0.1:5000/#/run-1",
                "ui_command": "mlflow ui", "run_key": "k-1", "work_key": "w-1"},
}
# What a step's library side stores beside the fields, as a cache entry's own bookkeeping: left out of the record.
BOOKKEEPING = {"step": "some-step", "plan": {"rows": [0, 1]}}
RECORDS = {cls.__name__: cls for cls in FIELDS}


@task(name="stored-step", persist_result=True, cache_key_fn=content_key(lambda kind, stored_as: f"stored-{kind}"))
def stored_step(kind: str, stored_as: str):
    cls = RECORDS[kind]
    if stored_as == "record":
        return cls(**FIELDS[cls])
    if stored_as == "dict":  # the form tuneline stored before its step results were records
        return {**FIELDS[cls], **BOOKKEEPING}
    raise AssertionError("the step ran: a stored result was expected")


@flow(name="stored-steps")
def run_stored_steps(folder: str, stored_as: str) -> dict:
    step = stored_step.with_options(result_storage=Path(folder))
    return {kind: cls.from_stored(step(kind, stored_as)) for kind, cls in RECORDS.items()}


if __name__ == "__main__":
    run_stored_steps(sys.argv[1], sys.argv[2])
