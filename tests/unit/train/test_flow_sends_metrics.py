"""The train step sends the training's step metrics to MLflow from the flow's process, read from the child's
trainer_log.jsonl: real `accelerate launch`, real training on the tiny model, a real SQLite MLflow store."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from train_helpers import make_config

from tuneline import tracking
from tuneline.pipeline import keys
from tuneline.pipeline.follow_log import MetricsSender
from tuneline.pipeline.train_step import train_model
from tuneline.train.trainer_log import logged_metrics

pytestmark = pytest.mark.slow


def test_the_train_step_sends_each_logged_step_and_the_training_needs_no_mlflow(
        tiny_model_dir, empty_mlflow_store, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from tuneline.data import build_dataset

    # an `mlflow` that cannot be imported, first on the training process's path only (this one has MLflow loaded)
    shadow = tmp_path / "shadow" / "mlflow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("the training process imported mlflow")\n')
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH")])))

    shutil.copy(empty_mlflow_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.open_run(uri, "sent-by-the-flow", "work-key", "metrics test", {})
    config = make_config(tiny_model_dir, tmp_path / "out", finetuning_type="lora", lora_rank=4, max_steps=6,
                         logging_steps=2, cutoff_len=64, max_samples=64, eval_dataset="demo_sft_eval",
                         template="chatml")
    dataset = build_dataset(config)
    key = keys.train_key(config, dataset["fingerprint"], keys.reference_key(config, dataset["fingerprint"]))
    lines: list[str] = []
    train_model(config, dataset, None, key, run_id, uri, on_line=lines.append)
    assert not any("mlflow" in line.lower() for line in lines), [line for line in lines if "mlflow" in line.lower()]

    log = [json.loads(line) for line in (tmp_path / "out" / "trainer_log.jsonl").read_text().splitlines()]
    client = MlflowClient(uri)

    def history(name: str) -> list[tuple[int, float, int]]:
        return sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, name))

    sent = {name for entry in log for name in logged_metrics(entry)}
    assert {"loss", "learning_rate", "grad_norm", "eval_loss"} <= sent
    for name in sent:  # every logged step, under the trainer's name and step, stamped when it was logged
        expected: dict[int, tuple] = {}  # a step's first value (its end logs `epoch` again with the evaluation)
        for entry in log:
            if name in (metrics := logged_metrics(entry)):
                expected.setdefault(entry["current_steps"], (metrics[name], int(entry["timestamp"] * 1000)))
        assert history(name) == sorted((step, *value) for step, value in expected.items()), name
    assert [step for step, _, _ in history("loss")] == [2, 4, 6]

    # a later start reads the whole log again (a resume does): MLflow holds each step once all the same
    before = {name: history(name) for name in sent}
    again = MetricsSender(run_id, uri, tmp_path / "out")
    again.send(log)
    assert again.close() == 0
    assert {name: history(name) for name in sent} == before
