"""`tuneline train` with no Prefect API configured: Prefect starts its own temporary server, in real processes."""

import os
import re
import subprocess
import sys

import pytest
from test_running_server import REPO, tiny_config


@pytest.mark.slow
def test_cli_train_runs_on_prefects_temporary_server(tmp_path, tiny_model_dir):
    """The path of `make demo`. Cached re-runs are tested against the test harness's API and a running server."""
    config = tiny_config(tmp_path, tiny_model_dir, max_steps=2, mlflow_experiment="cli-test")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(tmp_path / "home"), PREFECT_LOGGING_LEVEL="INFO",
               # Prefect gives its temporary server 20 s to start: too few beside a second test process
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120")
    run = subprocess.run([sys.executable, "-m", "flows.cli", "train", str(config)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Starting temporary server" in run.stderr
    finished = re.findall(r"Task run '([\w-]+)[^']*' - Finished in state Completed", run.stderr)
    assert set(finished) == {"load-tokenizer", "build-dataset", "build-reference-model", "train", "evaluate", "plot",
                             "model-card"}, finished

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("cli-test").experiment_id])
    assert run.data.tags["prefect.flow_run_id"]
    assert "prefect.flow_run_url" not in run.data.tags, "no link into a server that stopped with the run"
