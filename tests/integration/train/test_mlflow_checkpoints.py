"""Checkpoints in MLflow: logged from a real training once complete, restored into an empty output_dir, resumed.

Real MLflow (a SQLite store per test, copied from a template whose schema is built once) and the tiny model.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import pytest
from transformers import TrainerCallback

from tests.support.training import make_config, make_splits
from tuneline import tracking
from tuneline.errors import UserError
from tuneline.runtime.contract import read_run_file, write_run_file
from tuneline.tracking.artifacts import CHECKPOINT_MARKER, logged_checkpoints
from tuneline.train.checkpoints import is_complete
from tuneline.train.mlflow_checkpoints import restore_checkpoint_from_mlflow
from tuneline.train.output_dir import prepare_output_dir


def client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


@pytest.fixture
def mlflow_run(tmp_path, empty_mlflow_store, monkeypatch) -> tuple[str, str]:
    """A run in a fresh store, passed to training the way the launcher does: MLFLOW_RUN_ID + MLFLOW_TRACKING_URI."""
    shutil.copy(empty_mlflow_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.open_run(uri, "checkpoints", "work-key", "ckpt test", {})
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri, run_id


class Crash(Exception):
    pass


class CrashAt(TrainerCallback):
    """Stands in for a machine lost mid-training: stops the run after `step` without any clean-up."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Crash(f"machine lost after step {self.step}")


class SaveProbe(TrainerCallback):
    """Records, at each on_save, whether checkpoint-N is already renamed into place and complete."""

    def __init__(self):
        self.seen = []

    def on_save(self, args, state, control, **kwargs):
        out, name = Path(args.output_dir), f"checkpoint-{state.global_step}"
        self.seen.append((state.global_step, is_complete(out / name), (out / ".partial" / name).exists()))


class LoggedAtSave(TrainerCallback):
    """Records, at each on_save (after the metrics callback's), the last loss step MLflow already holds."""

    def __init__(self, uri: str, run_id: str):
        self.uri, self.run_id, self.seen = uri, run_id, []

    def on_save(self, args, state, control, **kwargs):
        history = tracking.metric_history(self.uri, self.run_id, "loss")
        self.seen.append((state.global_step, history[-1][0] if history else None))


def metrics_callback(trainer):
    from tuneline.train.callbacks import MlflowMetricsCallback

    return next(c for c in trainer.callback_handler.callbacks if isinstance(c, MlflowMetricsCallback))


def _weights(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_real_checkpoints_logged_restored_into_empty_dir_and_resumed_exactly(
    tiny_model_dir, tokenizer, tmp_path, mlflow_run, monkeypatch
):
    from tests.support.training import build, logged

    uri, run_id = mlflow_run
    splits = make_splits(tokenizer, train=24, validation=4)
    settings = {"max_steps": 6, "save_steps": 2, "mlflow_log_checkpoints": True}

    # machine 1 trains, logs checkpoint-2 and -4 to MLflow, and is lost after step 5
    first_dir = tmp_path / "machine1"
    config = make_config(tiny_model_dir, first_dir, **settings)
    lock, _ = prepare_output_dir(config, "train-key-1", run_id, "resume-key-1")
    lock.release()
    trainer, _ = build(config, "sft", tokenizer, splits)
    probe, sent = SaveProbe(), LoggedAtSave(uri, run_id)
    trainer.add_callback(probe)
    trainer.add_callback(sent)
    trainer.add_callback(CrashAt(5))
    with pytest.raises(Crash):
        trainer.train()
    assert metrics_callback(trainer).close() is None  # as run_stage's `finally` does: what was logged is sent
    assert probe.seen == [(2, True, False), (4, True, False)]  # on_save comes after the rename
    assert sent.seen == [(2, 2), (4, 4)]  # metrics go batched, but a checkpoint's steps are sent when it is saved
    store = client(uri)
    assert logged_checkpoints(store, run_id) == [(4, "checkpoint-4"), (2, "checkpoint-2")]
    marker = store.download_artifacts(run_id, f"checkpoints/checkpoint-4/{CHECKPOINT_MARKER}", str(tmp_path))
    assert json.loads(Path(marker).read_text()) == {"checkpoint": "checkpoint-4", "train_key": "train-key-1",
                                                    "resume_key": "resume-key-1"}

    # machine 2: output_dir does not exist; the entry point's own preparation restores from MLflow, across a change
    # of the exact train key that keeps the resume key (as other logging or saving settings do)
    from tuneline.train.__main__ import prepare

    second_dir = tmp_path / "machine2"
    config2 = make_config(tiny_model_dir, second_dir, **settings)
    monkeypatch.setenv("TUNELINE_TRAIN_KEY", "train-key-2")
    monkeypatch.setenv("TUNELINE_RESUME_KEY", "resume-key-1")
    lock = prepare(config2, {"path": "unused"}, True, lambda: None)
    lock.release()
    restored = Path(config2.training["resume_from_checkpoint"])
    assert restored == second_dir / "checkpoint-4"
    run_file = read_run_file(second_dir)
    assert run_file["resumed_from"] == str(restored) and run_file["resumed_step"] == 4
    original = first_dir / "checkpoint-4"
    assert sorted(p.name for p in restored.iterdir()) == sorted(p.name for p in original.iterdir())
    for path in original.iterdir():
        assert (restored / path.name).read_bytes() == path.read_bytes(), path.name
    assert not any(p.name.startswith(".tmp-") for p in second_dir.iterdir())
    # the log reaches back to the start again, from the checkpoint's history (the plots are drawn from it)
    history = json.loads((original / "trainer_state.json").read_text())["log_history"]
    from tuneline.pipeline.follow_log import TrainerLogReader

    rebuilt = TrainerLogReader(second_dir / "trainer_log.jsonl").new_entries()
    assert [(e["current_steps"], e["loss"]) for e in rebuilt] == [(h["step"], h["loss"]) for h in history]

    trainer2, _ = build(config2, "sft", tokenizer, splits)
    steps = SaveProbe()
    trainer2.add_callback(steps)
    trainer2.train(resume_from_checkpoint=str(restored))
    assert trainer2.state.global_step == 6 and steps.seen == [(6, True, False)]  # steps 5-6 only, then saved
    assert logged_checkpoints(store, run_id)[0] == (6, "checkpoint-6")  # the resumed run keeps logging
    metrics_callback(trainer2).close()

    # the same training without interruption (and without MLflow) ends with the same weights
    monkeypatch.delenv("MLFLOW_RUN_ID")
    reference, _ = build(make_config(tiny_model_dir, tmp_path / "reference", max_steps=6, save_steps=2),
                         "sft", tokenizer, splits)
    reference.train()
    expected, got = _weights(reference.model), _weights(trainer2.model)
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert (tensor - got[name]).abs().max().item() <= 1e-6, name
    # one metric history across both machines, each step once, equal to the uninterrupted run's
    history = tracking.metric_history(uri, run_id, "loss")
    assert [s for s, _ in history] == [1, 2, 3, 4, 5, 6]
    assert [v for _, v in history] == pytest.approx(logged(tmp_path / "reference", "loss"), abs=1e-5)


def test_restore_takes_the_newest_checkpoint_of_this_train_key(tiny_model_dir, tmp_path, mlflow_run, fake_checkpoint):
    uri, run_id = mlflow_run
    logged = tmp_path / "logged"
    tracking.log_checkpoint(run_id, fake_checkpoint(logged, 2), train_key="key-1")
    tracking.log_checkpoint(run_id, fake_checkpoint(logged, 4), train_key="key-2", resume_key="resume-2")
    partial = fake_checkpoint(tmp_path / "partial", 6)  # an upload cut short: no completion marker
    client(uri).log_artifacts(run_id, str(partial), "checkpoints/checkpoint-6")

    out = tmp_path / "out"
    out.mkdir()
    write_run_file(out, train_key="key-1")
    (out / ".tmp-checkpoint-4-dead").mkdir()  # a download killed midway
    config = make_config(tiny_model_dir, out, mlflow_log_checkpoints=True)
    assert restore_checkpoint_from_mlflow(config, out) == out / "checkpoint-2"
    weights = "checkpoint-2/adapter_model.safetensors"
    assert (out / weights).read_bytes() == (logged / weights).read_bytes()
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2", "run.json"]
    assert restore_checkpoint_from_mlflow(config, out) is None  # a local checkpoint exists now: nothing to do

    unkeyed = tmp_path / "unkeyed"  # no run.json: the newest complete checkpoint, whatever its key
    assert restore_checkpoint_from_mlflow(config, unkeyed) == unkeyed / "checkpoint-4"

    compatible = tmp_path / "compatible"  # another train key, checkpoint-4's resume key: other logging or saving
    compatible.mkdir()
    write_run_file(compatible, train_key="key-3", resume_key="resume-2")
    assert restore_checkpoint_from_mlflow(config, compatible) == compatible / "checkpoint-4"


def test_restore_only_when_asked_and_needed(tiny_model_dir, tmp_path, mlflow_run, monkeypatch, fake_checkpoint):
    _, run_id = mlflow_run
    out = tmp_path / "out"
    assert restore_checkpoint_from_mlflow(make_config(tiny_model_dir, out, mlflow_log_checkpoints=True), out) is None
    assert not out.exists()  # the run logged no checkpoint: nothing created

    tracking.log_checkpoint(run_id, fake_checkpoint(tmp_path / "logged", 3))
    off = make_config(tiny_model_dir, out)  # mlflow_log_checkpoints defaults to false
    assert restore_checkpoint_from_mlflow(off, out) is None
    explicit = make_config(tiny_model_dir, out, mlflow_log_checkpoints=True,
                           resume_from_checkpoint=str(tmp_path / "logged/checkpoint-3"))
    assert restore_checkpoint_from_mlflow(explicit, out) is None
    asked = make_config(tiny_model_dir, out, mlflow_log_checkpoints=True)
    monkeypatch.delenv("MLFLOW_RUN_ID")
    assert restore_checkpoint_from_mlflow(asked, out) is None
    assert not out.exists()
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    assert restore_checkpoint_from_mlflow(asked, out) == out / "checkpoint-3"


def test_restore_with_the_store_unreachable_fails_fast_and_clearly(tiny_model_dir, tmp_path, mlflow_run, monkeypatch):
    _, run_id = mlflow_run
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    out = tmp_path / "out"
    start = time.monotonic()
    with pytest.raises(UserError) as err:
        restore_checkpoint_from_mlflow(make_config(tiny_model_dir, out, mlflow_log_checkpoints=True), out)
    assert time.monotonic() - start < 5
    message = str(err.value)
    assert run_id in message and str(out) in message and "mlflow_log_checkpoints: false" in message


def test_mlflow_keeps_only_the_newest_checkpoints_like_save_total_limit(tmp_path, mlflow_run, fake_checkpoint):
    uri, run_id = mlflow_run
    logged = tmp_path / "logged"
    partial = fake_checkpoint(tmp_path / "partial", 1)  # an upload cut short long ago: no marker
    client(uri).log_artifacts(run_id, str(partial), "checkpoints/checkpoint-1")
    for step in (2, 4, 6, 8):
        tracking.log_checkpoint(run_id, fake_checkpoint(logged, step), train_key="key-1")

    deleted = tracking.prune_logged_checkpoints(run_id, 2, protect="checkpoint-2")  # e.g. the best one
    assert sorted(deleted) == ["checkpoint-1", "checkpoint-4"]
    store = client(uri)
    assert logged_checkpoints(store, run_id) == [(8, "checkpoint-8"), (6, "checkpoint-6"), (2, "checkpoint-2")]
    left = {info.path for info in store.list_artifacts(run_id, "checkpoints")}
    assert left == {"checkpoints/checkpoint-2", "checkpoints/checkpoint-6", "checkpoints/checkpoint-8"}
    assert tracking.prune_logged_checkpoints(run_id, 2, protect="checkpoint-2") == []  # nothing more to do


def test_training_prunes_mlflow_checkpoints_to_save_total_limit(tiny_model_dir, tokenizer, tmp_path, mlflow_run):
    from tests.support.training import build

    uri, run_id = mlflow_run
    config = make_config(tiny_model_dir, tmp_path / "out", max_steps=6, save_steps=2, save_total_limit=1,
                         mlflow_log_checkpoints=True)
    lock, _ = prepare_output_dir(config, "train-key-1", run_id)
    lock.release()
    trainer, _ = build(config, "sft", tokenizer, make_splits(tokenizer, train=24, validation=4))
    trainer.train()
    metrics_callback(trainer).close()
    assert logged_checkpoints(client(uri), run_id) == [(6, "checkpoint-6")]
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == ["checkpoint-6"]  # as on disk
