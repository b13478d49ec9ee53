"""Resume that survives what users change (issue 25), through the train step the flow's `train` task runs.

Two keys are kept apart: the exact train key (any change reruns the step) and the resume key (model, data, the
settings that shape the weights). A rerun that differs only in the second's complement resumes from its checkpoint
and says so; any other is refused, or with `overwrite_output_dir` set aside next to output_dir, never deleted
unless `discard_checkpoints` names it. A second run on a busy output_dir is refused naming the running one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.support.training import make_config, train_step
from tuneline.content.records import BuiltDataset
from tuneline.errors import UserError
from tuneline.runtime.contract import LOCKED_ENV, LockHeld, read_run_file
from tuneline.train.checkpoints import complete_checkpoints
from tuneline.train.output_dir import decide_resume, prepare_output_dir

SETTINGS = {"max_steps": 4, "save_steps": 2, "logging_steps": 1, "max_samples": 32, "cutoff_len": 64,
            "overwrite_output_dir": True}  # as LLaMA-Factory's examples set it


def _fake_checkpoint(path: Path, state: str = "{}") -> None:
    path.mkdir(parents=True)
    save_file({"weight": torch.zeros(2)}, str(path / "model.safetensors"))  # whole: resume reads its header
    (path / "trainer_state.json").write_text(state)


def _aside(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f"{out.name}.superseded-*"))


def _start(config, key: str, resume_key: str) -> Path | None:
    lock, resume = prepare_output_dir(config, key, "mlflow-run-1", resume_key)
    lock.release()
    return resume


def test_a_change_that_keeps_the_optimisation_resumes_and_says_which(tiny_model_dir, tmp_path, caplog):
    out = tmp_path / "out"
    assert _start(make_config(tiny_model_dir, out), "exact-1", "resume-1") is None
    _fake_checkpoint(out / "checkpoint-3")
    with caplog.at_level(logging.WARNING, logger="tuneline.train.output_dir"):
        resume = _start(make_config(tiny_model_dir, out, logging_steps=5), "exact-2", "resume-1")
    assert resume == out / "checkpoint-3" and read_run_file(out)["resumed_step"] == 3
    assert "resuming from checkpoint-3 (step 3)" in caplog.text and "logging_steps 1 -> 5" in caplog.text
    assert read_run_file(out)["train_key"] == "exact-2" and read_run_file(out)["settings"]["logging_steps"] == 5


def test_a_plain_resume_says_where_it_resumes(tiny_model_dir, tmp_path, caplog):
    out = tmp_path / "out"
    _start(make_config(tiny_model_dir, out), "exact-1", "resume-1")
    _fake_checkpoint(out / "checkpoint-3")
    with caplog.at_level(logging.INFO, logger="tuneline.train.output_dir"):
        assert _start(make_config(tiny_model_dir, out), "exact-1", "resume-1") == out / "checkpoint-3"
    assert "resuming from checkpoint-3 (step 3)" in caplog.text and "change" not in caplog.text


def test_the_mlflow_run_follows_what_resumes_and_a_finished_run_the_exact_work(tiny_model_dir, tmp_path):
    """keys.run_key (which MLflow run a start continues) moves with the resume key and output_dir; keys.work_key
    (which finished run is this config's result) with every setting of the train key."""
    from tuneline.identity import keys

    def mlflow_keys(output_dir: Path = tmp_path / "out", **overrides) -> tuple[str, str]:
        config = make_config(tiny_model_dir, output_dir, **overrides)
        run_key = keys.run_key(config, "dataset-fp")
        return run_key, keys.work_key(config, run_key)

    run_key, work_key = mlflow_keys()
    assert mlflow_keys() == (run_key, work_key)
    for watched in ({"logging_steps": 5}, {"save_steps": 3}):
        resumed_run, resumed_work = mlflow_keys(**watched)
        assert resumed_run == run_key and resumed_work != work_key, watched
    assert mlflow_keys(learning_rate=1e-3)[0] != run_key  # other maths: another training, another run
    assert mlflow_keys(tmp_path / "twin")[0] != run_key  # the same training into another folder: its own run


def test_a_change_of_the_maths_is_refused_then_set_aside_never_deleted(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    _start(make_config(tiny_model_dir, out), "exact-1", "resume-1")
    _fake_checkpoint(out / "checkpoint-3")
    changed = make_config(tiny_model_dir, out, learning_rate=1e-3)
    with pytest.raises(UserError, match="overwrite_output_dir") as err:
        _start(changed, "exact-2", "resume-2")
    assert "learning_rate 0.005 -> 0.001" in str(err.value)
    assert (out / "checkpoint-3").is_dir() and not _aside(out)  # refused: nothing moved

    changed.training["overwrite_output_dir"] = True
    assert _start(changed, "exact-2", "resume-2") is None
    [aside] = _aside(out)
    assert load_file(aside / "checkpoint-3" / "model.safetensors")["weight"].tolist() == [0.0, 0.0]
    assert json.loads((aside / "run.json").read_text())["train_key"] == "exact-1"
    assert not (out / "checkpoint-3").exists() and read_run_file(out)["train_key"] == "exact-2"

    _fake_checkpoint(out / "checkpoint-2")  # the user names deleting: `discard_checkpoints`
    discarding = make_config(tiny_model_dir, out, learning_rate=1e-4, overwrite_output_dir=True,
                             discard_checkpoints=True)
    assert _start(discarding, "exact-3", "resume-3") is None
    assert not (out / "checkpoint-2").exists() and len(_aside(out)) == 1


def test_an_unreadable_checkpoint_is_set_aside_and_the_one_before_resumed(tmp_path, caplog):
    _fake_checkpoint(tmp_path / "out" / "checkpoint-2")
    _fake_checkpoint(tmp_path / "out" / "checkpoint-4", state='{"global_st')  # cut short by a full disk
    (tmp_path / "out" / "run.json").write_text(json.dumps({"train_key": "k"}))
    with caplog.at_level(logging.WARNING, logger="tuneline.train.output_dir"):
        assert decide_resume(tmp_path / "out", "k") == tmp_path / "out" / "checkpoint-2"
    [aside] = _aside(tmp_path / "out")
    assert (aside / "checkpoint-4" / "trainer_state.json").is_file() and str(aside) in caplog.text


def test_a_second_run_on_a_busy_output_dir_is_refused_naming_the_running_one(tiny_model_dir, tmp_path):
    """A real second process holds the lock, as a training child does."""
    from tuneline.pipeline.train_step import prepare_training

    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; from tuneline.runtime.contract import OutputDirLock; "
         f"lock = OutputDirLock({str(out)!r}, mlflow_run_id='run-abc', run_name='nightly'); print('locked', "
         "flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        config = make_config(tiny_model_dir, out)
        with pytest.raises(LockHeld, match=f"pid {holder.pid} on host .*MLflow run run-abc, run 'nightly'"):
            prepare_training(config, BuiltDataset("unused", "d"), None, "k", None, None, on_line=print)
        assert not (out / "tuneline_config.yaml").exists()  # refused before writing anything there
    finally:
        holder.kill()
        holder.wait()


def test_the_train_step_holds_the_lock_for_its_child_which_takes_it_no_second_time(tiny_model_dir, tmp_path,
                                                                                   monkeypatch):
    """One lock per training: the flow's side takes it before writing anything and holds it while its child runs;
    a second start meanwhile is refused naming the first, the child (told so in its environment) does not take it
    again, and a child started alone takes it for itself."""
    from tuneline.pipeline.train_step import prepare_training

    out = tmp_path / "out"
    config = make_config(tiny_model_dir, out, run_name="nightly")
    first = prepare_training(config, BuiltDataset("data", "d"), None, "k", "run-abc", None, on_line=print)
    try:
        assert first.command and first.env[LOCKED_ENV] == str(out.resolve())
        written = (out / "tuneline_config.yaml").stat().st_mtime_ns
        with pytest.raises(LockHeld, match=f"pid {os.getpid()} on host .*MLflow run run-abc, run 'nightly'"):
            prepare_training(config, BuiltDataset("data", "d"), None, "k2", None, None, on_line=print)
        assert (out / "tuneline_config.yaml").stat().st_mtime_ns == written  # refused before writing anything
        monkeypatch.setenv(LOCKED_ENV, first.env[LOCKED_ENV])  # as the child's environment holds it
        lock, resume = prepare_output_dir(config, "k", "run-abc", "resume-k")
        assert lock is None and resume is None and read_run_file(out)["status"] == "running"
    finally:
        first.release()
    monkeypatch.delenv(LOCKED_ENV)
    alone, _ = prepare_output_dir(config, "k", None, "resume-k")  # no flow launched it: it locks for itself
    try:
        with pytest.raises(LockHeld, match=f"pid {os.getpid()} on host"):
            prepare_training(config, BuiltDataset("data", "d"), None, "k", None, None, on_line=print)
    finally:
        alone.release()


def test_logging_and_saving_changed_after_a_kill_resume_a_real_training(tiny_model_dir, tmp_path):
    """The train step with a real child: a checkpoint from a short run, the state a kill after it leaves, then
    reruns with other logging/saving (resumes, its global step continues), after it finished (kept), and with
    another learning rate (the old run moved aside, a fresh start)."""
    from tuneline.data import build_dataset
    from tuneline.identity import keys
    from tuneline.runtime.contract import RUN_FILE, write_run_file

    out = tmp_path / "out"
    data = build_dataset(make_config(tiny_model_dir, out, **SETTINGS))

    def run(**overrides) -> tuple[dict, list[str]]:
        config = make_config(tiny_model_dir, out, **{**SETTINGS, **overrides})
        reference = {"needed": False, "fingerprint": keys.reference_key(config, data["fingerprint"])}
        lines: list[str] = []
        key = keys.train_key(config, data["fingerprint"], reference["fingerprint"])
        return train_step(config, data, reference, key, None, None, on_line=lines.append), lines

    run()
    (out / "model.safetensors").unlink()
    shutil.rmtree(out / "checkpoint-4")  # what a kill after checkpoint-2 leaves
    write_run_file(out, status="running")
    ref, lines = run(logging_steps=2, save_steps=3)
    assert any("resuming from checkpoint-2 (step 2)" in line and "logging_steps 1 -> 2" in line for line in lines)
    assert read_run_file(out)["resumed_step"] == 2 and read_run_file(out)["global_step"] == 4
    assert [p.name for p in complete_checkpoints(out)] == ["checkpoint-2", "checkpoint-3", "checkpoint-4"]  # new save_steps
    logged = [json.loads(line)["current_steps"] for line in (out / "trainer_log.jsonl").read_text().splitlines()
              if "loss" in json.loads(line)]
    assert logged == [1, 2, 4]  # steps 1-2 from the first start, then every 2nd: the new logging_steps

    marker = (out / RUN_FILE).stat().st_mtime_ns
    ref_kept, lines = run(logging_steps=3)  # finished: kept, not trained again
    assert any("the finished training is kept" in line for line in lines) and ref_kept.metrics == ref.metrics
    assert (out / RUN_FILE).stat().st_mtime_ns == marker  # read, not rewritten: the child is run.json's one writer

    _, lines = run(learning_rate=1e-3)
    [aside] = _aside(out)
    assert [p.name for p in complete_checkpoints(aside)] == ["checkpoint-2", "checkpoint-3", "checkpoint-4"]
    assert any(str(aside) in line for line in lines)
    assert read_run_file(out)["resumed_step"] == 0 and read_run_file(out)["global_step"] == 4


def test_an_edit_of_the_training_code_reruns_the_step_but_resumes_into_the_same_run(tiny_model_dir, tmp_path):
    """The train key holds the version of the code the training imports; the resume, run and standalone keys hold
    none, so an edited trainer (here in a copy of the package) reruns the step, resumes its checkpoints and logs
    into the same MLflow run."""
    import tuneline

    package = tmp_path / "code" / "tuneline"
    shutil.copytree(Path(tuneline.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    code = (
        f"import sys; sys.path.append({str(Path(__file__).parents[3])!r})\n"  # the repo, after the edited copy
        "from pathlib import Path\n"
        "from tests.support.training import make_config\n"
        "from tuneline.identity import keys\n"
        f"c = make_config(Path({str(tiny_model_dir)!r}), Path({str(tmp_path / 'out')!r}))\n"
        "print(keys.train_key(c, 'd', 'r'), keys.resume_key(c, 'd', 'r'), keys.run_key(c, 'd'),"
        " keys.standalone_key(c, {'fingerprint': 'd'}))\n"
    )

    def step_keys() -> list[str]:
        env = {**os.environ, "PYTHONPATH": str(package.parent)}
        return subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True, capture_output=True,
                              text=True).stdout.split()

    train, *resume_run_standalone = step_keys()
    trainer = package / "train" / "sft.py"
    trainer.write_text(trainer.read_text() + "\n# an edit of the trainer\n")
    edited_train, *edited_rest = step_keys()
    assert edited_train != train and edited_rest == resume_run_standalone
