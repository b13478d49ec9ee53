"""`tuneline train` with no Prefect API configured: Prefect starts its own temporary server, in real processes."""

import os
import re
import subprocess
import sys

import pytest
from test_running_server import REPO, tiny_config


@pytest.mark.slow
def test_cli_train_runs_on_prefects_temporary_server_and_again_all_cached(tmp_path, tiny_model_dir):
    config = tiny_config(tmp_path, tiny_model_dir, max_steps=2, mlflow_experiment="cli-test")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(tmp_path / "home"), PREFECT_LOGGING_LEVEL="INFO")
    command = [sys.executable, "-m", "flows.cli", "train", str(config)]
    runs = [subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
        assert "Starting temporary server" in run.stderr
    cached = re.findall(r"Task run '([\w-]+)[^']*' - Finished in state Cached", runs[1].stderr)
    assert set(cached) == {"load-tokenizer", "build-dataset", "build-reference-model", "train", "evaluate", "plot",
                           "model-card"}, cached

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("cli-test").experiment_id])
    assert run.data.tags["prefect.flow_run_id"]
    assert "prefect.flow_run_url" not in run.data.tags, "no link into a server that stopped with the run"
