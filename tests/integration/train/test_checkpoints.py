"""Checkpoints complete or absent, rotation, and the output_dir contract (run.json, lock, key mismatch)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.support.training import make_config, make_splits
from tuneline.errors import UserError
from tuneline.runtime.contract import LockHeld, OutputDirLock, read_run_file
from tuneline.train.checkpoints import complete_checkpoints, last_complete_checkpoint
from tuneline.train.output_dir import decide_resume, prepare_output_dir


def test_checkpoints_rotate_and_hold_everything_to_resume(tiny_model_dir, tokenizer, tmp_path):
    from tests.support.training import build
    from tuneline.train.trainer_base import train_and_evaluate

    out = tmp_path / "out"
    config = make_config(tiny_model_dir, out, max_steps=6, save_steps=2, save_total_limit=2)
    trainer, spec = build(config, "sft", tokenizer, make_splits(tokenizer, train=24, validation=4))
    train_and_evaluate(trainer, config, spec, tokenizer)
    assert [p.name for p in complete_checkpoints(out)] == ["checkpoint-4", "checkpoint-6"]
    assert not any((out / ".partial").iterdir())  # nothing left in staging
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
                 "tokenizer.json", "chat_template.jinja"):
        assert (out / "checkpoint-6" / name).is_file(), name


def _fake_checkpoint(path, complete=True):
    """A checkpoint folder with a real (tiny) safetensors file: one that does not read is set aside, not resumed."""
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    save_file({"weight": torch.zeros(2, 2)}, str(path / "model.safetensors"))
    if complete:
        (path / "trainer_state.json").write_text("{}")


def test_half_written_checkpoint_is_never_resumed_from(tmp_path):
    _fake_checkpoint(tmp_path / "checkpoint-4")
    _fake_checkpoint(tmp_path / "checkpoint-10", complete=False)  # a folder cut short (not made by us)
    _fake_checkpoint(tmp_path / ".partial" / "checkpoint-8")  # killed before the rename
    _fake_checkpoint(tmp_path / "checkpoint-x")
    assert last_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-4"
    (tmp_path / "run.json").write_text(json.dumps({"train_key": "k1"}))
    assert decide_resume(tmp_path, "k1") == tmp_path / "checkpoint-4"
    assert not (tmp_path / ".partial").exists()  # the killed save's leftovers are cleared


def test_same_key_resumes_and_other_key_is_refused_unless_overwrite(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    config = make_config(tiny_model_dir, out)
    lock, resume = prepare_output_dir(config, "key-one", "mlflow-run-1")
    lock.release()
    assert resume is None
    run = read_run_file(out)
    assert run["train_key"] == "key-one" and run["mlflow_run_id"] == "mlflow-run-1" and run["status"] == "running"
    _fake_checkpoint(out / "checkpoint-3")
    lock, resume = prepare_output_dir(config, "key-one", "mlflow-run-1")
    lock.release()
    assert resume == out / "checkpoint-3" and read_run_file(out)["resumed_step"] == 3

    with pytest.raises(UserError, match="overwrite_output_dir") as err:
        prepare_output_dir(config, "key-two", None)
    assert "key-two"[:12] in str(err.value) and str(out) in str(err.value)
    assert (out / "checkpoint-3").is_dir()  # refused: nothing removed

    (out / "tuneline_config.yaml").write_text("stage: sft\n")
    config.training["overwrite_output_dir"] = True
    lock, resume = prepare_output_dir(config, "key-two", None)
    lock.release()
    assert resume is None and not (out / "checkpoint-3").exists()
    [aside] = out.parent.glob("out.superseded-*")  # replaced, never deleted unless `discard_checkpoints` says so
    assert (aside / "checkpoint-3" / "trainer_state.json").is_file() and (aside / "run.json").is_file()
    assert (out / "tuneline_config.yaml").is_file()  # the launcher's resolved config stays
    assert read_run_file(out)["train_key"] == "key-two"


def test_explicit_resume_path_must_be_a_complete_checkpoint(tmp_path):
    _fake_checkpoint(tmp_path / "elsewhere" / "checkpoint-2", complete=False)
    with pytest.raises(UserError, match="resume_from_checkpoint"):
        decide_resume(tmp_path / "out", "k", resume_from_checkpoint=str(tmp_path / "elsewhere" / "checkpoint-2"))


def test_second_trainer_gets_an_error_naming_the_lock_holder(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from tuneline.runtime.contract import OutputDirLock; "
         f"lock = OutputDirLock({str(tmp_path)!r}); print('locked', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LockHeld, match=f"pid {holder.pid} on host"):
            OutputDirLock(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    deadline = time.time() + 10
    while True:  # the OS releases a killed holder's lock
        try:
            OutputDirLock(tmp_path).release()
            break
        except LockHeld:
            assert time.time() < deadline
            time.sleep(0.1)


def test_resume_from_the_last_step_trains_no_extra_step(tiny_model_dir, tokenizer, tmp_path):
    """A relaunch that finds checkpoint-<max_steps> ends there: no step max_steps+1, the same final weights."""
    from safetensors.torch import load_file

    from tests.support.training import build
    from tuneline.train.trainer_base import train_and_evaluate

    out = tmp_path / "out"
    splits = make_splits(tokenizer, train=24, validation=4)  # 6 steps an epoch: step 4 is mid-epoch
    config = make_config(tiny_model_dir, out, max_steps=4, save_steps=2, do_eval=True)
    trainer, spec = build(config, "sft", tokenizer, splits)
    train_and_evaluate(trainer, config, spec, tokenizer)
    first_log = (out / "trainer_log.jsonl").read_text()
    config.training["resume_from_checkpoint"] = str(out / "checkpoint-4")
    trainer, spec = build(config, "sft", tokenizer, splits)
    metrics = train_and_evaluate(trainer, config, spec, tokenizer)
    assert trainer.state.global_step == 4
    assert [p.name for p in complete_checkpoints(out)] == ["checkpoint-2", "checkpoint-4"]
    checkpoint, final = load_file(str(out / "checkpoint-4" / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert all(torch_equal(checkpoint[name], final[name]) for name in checkpoint)
    records = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    assert max(r["current_steps"] for r in records) == 4 and not any(r.get("train_loss") == 0.0 for r in records)
    assert (out / "trainer_log.jsonl").read_text().startswith(first_log)
    assert "train_loss" not in metrics and "eval_loss" in metrics  # nothing trained, but evaluated as at the end


def torch_equal(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())
