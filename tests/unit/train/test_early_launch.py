"""The training launch started before the flow reaches `train` (tuneline.train.early_launch), and the tuned
model's evaluation done by the training process for the evaluate step: real `accelerate launch`, real training."""

from __future__ import annotations

import json
import os
import sys
import threading

import psutil
import pytest
from train_helpers import make_config

from tuneline.pipeline import keys
from tuneline.pipeline.give_way import WATCHER_NICE
from tuneline.pipeline.train_step import COMPLETE_MARKER, early_launch, train_model
from tuneline.train.early_launch import EarlyLaunch
from tuneline.train.launch import launch_command, launcher

pytestmark = pytest.mark.slow
SETTINGS = {"finetuning_type": "lora", "lora_rank": 4, "max_steps": 2, "cutoff_len": 64, "max_samples": 64,
            "eval_dataset": "demo_sft_eval", "template": "chatml", "eval_max_samples": 4, "eval_max_new_tokens": 2,
            "per_device_eval_batch_size": 8}


@pytest.fixture(scope="module")
def built(tiny_model_dir, tmp_path_factory):
    """The demo sft data with its validation split, as the flow's build-dataset step returns it."""
    from tuneline.data import build_dataset

    root = tmp_path_factory.mktemp("early")
    return root, build_dataset(make_config(tiny_model_dir, root / "unused", **SETTINGS))


def test_the_train_step_takes_the_early_launch_and_the_child_evaluates_for_the_evaluate_step(
        tiny_model_dir, built, monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from tuneline.evaluation import evaluate_model

    root, dataset = built
    config = make_config(tiny_model_dir, root / "out", **SETTINGS)
    key = keys.train_key(config, dataset["fingerprint"], keys.reference_key(config, dataset["fingerprint"]))
    lines: list[str] = []
    priorities: list[tuple[int, ...]] = []  # while training runs: the step's thread, on_line's, another, training's
    watching, stop, step_thread = threading.Thread(target=lambda: stop.wait()), threading.Event(), threading.get_native_id()
    watching.start()

    def on_line(line: str) -> None:
        lines.append(line)
        trainer = [p for p in psutil.Process(early.process.pid).children(recursive=True) if "tuneline.train" in
                   " ".join(p.cmdline())]
        if "started early" in line and trainer:
            priorities.append(tuple(os.getpriority(os.PRIO_PROCESS, thread) for thread in
                                    (step_thread, threading.get_native_id(), watching.native_id)) + (trainer[0].nice(),))

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    with early_launch(config) as early:
        assert early is not None, "no finished training for this key: the launch starts at once"
        cache_dir()  # what torch does here on a first run, once a step before `train` imported it
        try:
            result = train_model(config, dataset, None, key, None, None, on_line=on_line)
        finally:
            stop.set()
        assert early.process.returncode == 0 and not early.folder.exists()
    assert result["train_key"] == key and (root / "out" / COMPLETE_MARKER).is_file()
    assert any("started early" in line for line in lines), lines[-20:]
    if sys.platform.startswith("linux"):  # a nice value per thread: the watchers give way, training keeps its own
        assert priorities == [(0, WATCHER_NICE, WATCHER_NICE, 0)], priorities
    assert json.loads((root / "out" / "run.json").read_text())["train_key"] == key  # set after the imports

    # the evaluate step finds the training process's evaluation, and it is the one this process computes
    from_child = evaluate_model(config, dataset, str(root / "out"), key)
    assert from_child["cache_hit"] is True
    import dataclasses

    fresh_config = dataclasses.replace(config, pipeline=dataclasses.replace(config.pipeline, refresh_cache=True))
    here = evaluate_model(fresh_config, dataset, str(root / "out"), key)
    assert here["cache_hit"] is False and here["metrics"].keys() == from_child["metrics"].keys()
    for name, value in here["metrics"].items():
        assert from_child["metrics"][name] == pytest.approx(value, abs=1e-6), name

    with early_launch(config) as again:
        assert again is None, "finished for this key: a re-run starts nothing"


def test_early_launch_only_where_the_train_step_will_launch(tiny_model_dir, built):
    root, dataset = built
    done = make_config(tiny_model_dir, root / "done", **SETTINGS)
    done.output_dir.mkdir(parents=True)
    key = keys.train_key(done, dataset["fingerprint"], keys.reference_key(done, dataset["fingerprint"]))
    (done.output_dir / COMPLETE_MARKER).write_text(json.dumps({"train_key": key}))
    with early_launch(done) as launch:
        assert launch is None
    forced = make_config(tiny_model_dir, root / "done", **SETTINGS, refresh_cache=True)
    with early_launch(forced) as launch:
        assert launch is not None and launch.process.poll() is None
    assert launch.process.poll() is not None and not launch.folder.exists()  # unused: stopped on exit
    chained = make_config(tiny_model_dir, root / "ppo", **SETTINGS, reward_model_config="rm.yaml")
    with early_launch(chained) as launch:
        assert launch is None  # a reward-model subflow trains first


@pytest.mark.parametrize("change", ["launcher", "environment"])
def test_an_early_launch_that_cannot_stand_for_the_launch_is_stopped(tiny_model_dir, tmp_path, change):
    config = make_config(tiny_model_dir, tmp_path / "out", **SETTINGS)
    early = EarlyLaunch(launcher(config), config.stage)
    env = dict(os.environ)
    if change == "launcher":
        other = make_config(tiny_model_dir, tmp_path / "out", **SETTINGS, num_processes=2)
        cmd = launch_command(other, "c.yaml")
    else:
        cmd = launch_command(config, "c.yaml")
        env["HF_HOME"] = str(tmp_path / "hf")  # read at import time: the waiting process has it wrong
    assert early.begin(cmd, env) is None
    assert early.process.poll() is not None and not early.folder.exists()
    assert not (tmp_path / "out").exists()  # it never got as far as the output_dir


PRELOAD_PROBE = """
import json, sys, threading, time
from pathlib import Path
from tuneline.train.early_launch import wait_for_start

start = Path(sys.argv[1])
def start_once_preloaded():  # the flow is ready only after the waiting process has imported everything
    while "sacrebleu" not in sys.modules:
        time.sleep(0.01)
    start.write_text(json.dumps({"argv": ["c.yaml"], "env": {}}))
if sys.argv[2] == "late":
    threading.Thread(target=start_once_preloaded, daemon=True).start()
argv = wait_for_start(start, "sft")
print(json.dumps({"argv": argv, "mlflow": "mlflow" in sys.modules, "sacrebleu": "sacrebleu" in sys.modules}))
"""


@pytest.mark.parametrize("start", ["ready", "late"])
def test_a_waiting_launch_imports_what_training_needs_first_and_the_rest_only_while_the_start_has_not_come(
        tmp_path, start):
    """A fresh interpreter each (what is imported is the point): a start already there when the training's
    imports are done is taken at once, the text metrics left to the step that uses them; a start that comes
    later finds them imported. MLflow never is: the flow sends the training's metrics itself."""
    import subprocess
    import sys

    start_file = tmp_path / "start.json"
    if start == "ready":
        start_file.write_text(json.dumps({"argv": ["c.yaml"], "env": {}}))
    done = subprocess.run([sys.executable, "-c", PRELOAD_PROBE, str(start_file), start], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["argv"] == ["c.yaml"]
    assert seen["sacrebleu"] is (start == "late")
    assert seen["mlflow"] is False


def test_start_folders_of_commands_that_are_gone_are_removed(tmp_path):
    """A command killed while it trained never removed its start folder; the next early launch does."""
    import subprocess
    import sys

    from tuneline.train.early_launch import FOLDER_PREFIX, remove_abandoned_folders

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        folders = {name: tmp_path / f"{FOLDER_PREFIX}{name}" for name in
                   (f"{gone.pid}-abc", f"{running.pid}-def", f"{os.getpid()}-ghi", "x1y2z3", "notapid-jkl")}
        for folder in folders.values():
            folder.mkdir()
            (folder / "start.json").write_text("{}")
        remove_abandoned_folders(tmp_path)
        assert not folders[f"{gone.pid}-abc"].exists()
        assert all(folder.exists() for name, folder in folders.items() if name != f"{gone.pid}-abc")
    finally:
        running.kill()
        running.wait()
