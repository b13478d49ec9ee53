"""Two machines on this one: the main machine's train step (rank 0) and `tuneline train-node --machine-rank 1` in a
subprocess, one CPU process each over gloo, meeting at 127.0.0.1 through accelerate's multi-node launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.support.ports import free_port
from tests.support.training import REPO_ROOT, train_step, write_config

SETTINGS = {"per_device_train_batch_size": 2, "max_steps": 3, "save_steps": 2, "max_samples": 32, "cutoff_len": 64,
            "num_machines": 2, "main_process_ip": "127.0.0.1", "num_processes": 1}


def test_two_machines_train_one_model_and_only_the_main_one_saves_and_logs(tiny_model_dir, tmp_path,
                                                                           empty_mlflow_store):
    import shutil

    from tuneline import tracking
    from tuneline.config import load_config
    from tuneline.data import build_dataset
    from tuneline.identity import keys

    shutil.copy(empty_mlflow_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    main_dir, node_dir = tmp_path / "out", tmp_path / "node-out"
    cfg = write_config(tmp_path / "c.yaml", tiny_model_dir, main_dir, **SETTINGS, main_process_port=free_port())
    run_id = tracking.open_run(uri, "multinode", "work-key", "two machines", {})
    # The other machine starts first and waits for the main one's dataset. Its output_dir differs only here, so that
    # what rank 1 writes shows (on real machines it is the same shared folder). Its shell has the main run's
    # MLflow variables, as a user's might: it must still log nothing.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MLFLOW_TRACKING_URI": uri, "MLFLOW_RUN_ID": run_id,
           "PYTHONUNBUFFERED": "1"}
    node_log = tmp_path / "node.log"
    with open(node_log, "w") as out:
        node = subprocess.Popen([sys.executable, "-m", "cli.main", "train-node", str(cfg), f"output_dir={node_dir}",
                                 "--machine-rank", "1", "--wait", "120"], cwd=REPO_ROOT, env=env, text=True,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "waiting for the main machine's flow" not in node_log.read_text():  # it is there before the data
            assert node.poll() is None and time.monotonic() < deadline, node_log.read_text()[-3000:]
            time.sleep(0.2)
        config = load_config(cfg)
        dataset = build_dataset(config)
        reference = {"needed": False, "fingerprint": keys.reference_key(config, dataset["fingerprint"])}
        key = keys.train_key(config, dataset["fingerprint"], reference["fingerprint"])
        lines: list[str] = []
        result = train_step(config, dataset, reference, key, run_id, uri, on_line=lines.append)
        node.wait(timeout=120)
    finally:
        node.kill()
    node_output = node_log.read_text()
    assert node.returncode == 0, node_output[-3000:]
    assert "waiting for the main machine's flow to build build-dataset" in node_output
    assert "machine 1 of 2: joining 127.0.0.1" in node_output

    state = json.loads((main_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and state["train_batch_size"] == 2  # per process
    rows = dataset["train_rows"]
    assert state["epoch"] == pytest.approx(3 * 2 * 2 / rows)  # each step took 2 rows on each of 2 processes
    assert (main_dir / "checkpoint-2").is_dir() and result.metrics["train_loss"] > 0
    # rank 1 saved no model, optimizer, log or results: only its RNG state into the checkpoints being staged, which
    # is why output_dir must be one shared folder (a resume restores every process's RNG state from there)
    written = sorted(str(p.relative_to(node_dir)) for p in node_dir.rglob("*") if p.is_file())
    assert written == [".partial/checkpoint-2/rng_state_1.pth", ".partial/checkpoint-3/rng_state_1.pth"]
    assert [step for step, _ in tracking.metric_history(uri, run_id, "loss")] == [1, 2, 3]  # once each: rank 0's
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert [r.info.run_id for r in runs] == [run_id]  # no run of rank 1's own
