"""A real `mlflow server` on 127.0.0.1: tracking over HTTP, and the server unreachable at start or lost midway.

The server runs as a subprocess (SQLite backend and proxied artifact root in a temporary folder), started once
for the module and stopped by its pid (the process group it leads). The outage test stops it and starts it
again on the same port and backend, as an operator restarting it would.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tuneline import tracking
from tuneline.errors import UserError
from tuneline.tracking.step_logger import SPOOL_NAME, spooled_count


class MlflowServer:
    """`mlflow server -w 1` bound to 127.0.0.1; start() waits for /health, stop() ends its process group."""

    def __init__(self, root: Path):
        self.root, self.port, self.proc = root, free_port(), None
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 90) -> float:
        """Start and wait until it answers; returns the seconds that took."""
        start = time.monotonic()
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job runner: starts faster
        cmd = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port),
               "--workers", "1", "--backend-store-uri", f"sqlite:///{self.root / 'server.db'}",
               "--artifacts-destination", str(self.root / "artifacts")]
        with open(self.root / "server.log", "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        while time.monotonic() - start < timeout_s:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=1):
                    return time.monotonic() - start
            except OSError:
                assert self.proc.poll() is None, (self.root / "server.log").read_text()[-2000:]
                time.sleep(0.2)
        self.stop()
        raise AssertionError(f"mlflow server did not answer in {timeout_s} s")

    def stop(self) -> None:
        """SIGTERM to the group the server leads (the server and its uvicorn worker), SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    srv.start()
    yield srv
    srv.stop()


# --- unreachable at start: fail before any work, fast ----------------------------------------------------------


def test_unreachable_server_at_start_fails_fast_with_a_clear_message():
    from tuneline.config import load_config
    from tuneline.pipeline.record import start_run

    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens: refused at once
    start = time.monotonic()
    with pytest.raises(UserError) as err:
        tracking.check_tracking_available(closed)
    assert time.monotonic() - start < 1
    message = str(err.value)
    assert closed in message and "not reachable" in message and "mlflow server --host 127.0.0.1" in message

    config = load_config(None, {"model_name_or_path": "tiny", "stage": "sft", "dataset": "demo_sft",
                                "output_dir": "unused", "mlflow_tracking_uri": closed}, check_paths=False)
    start = time.monotonic()
    with pytest.raises(UserError, match="not reachable"):  # the flow's first MLflow step
        start_run(config, "dataset-fp", None, None)
    assert time.monotonic() - start < 1

    with socket.socket() as silent:  # accepts connections (kernel backlog) but never answers: a hung server
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        hung = f"http://127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(UserError, match="not reachable"):
            tracking.check_tracking_available(hung, timeout_s=2)
        assert 1.5 < time.monotonic() - start < 4  # bounded by timeout_s, not MLflow's minutes of retries


# --- a live server over HTTP -----------------------------------------------------------------------------------


def test_tracks_a_run_over_http(server, tmp_path):
    uri = server.uri
    tracking.check_tracking_available(uri)
    run_id = tracking.open_run(uri, "http-exp", "work-1", "sft-full tiny over http", {"stage": "sft"})
    assert tracking.open_run(uri, "http-exp", "work-1", "again", {}) == run_id  # same work, same run
    tracking.log_params(run_id, {"training": {"learning_rate": 0.1}, "model": {"hf_hub_token": "hf_x"}})

    logger = tracking.StepMetricLogger(run_id, uri, tmp_path / "out")
    for step in range(1, 6):
        logger.log({"loss": 5.0 - step, "learning_rate": 0.1}, step)
    assert logger.close() == 0

    (tmp_path / "trainer_log.jsonl").write_text('{"current_steps": 5, "loss": 0.0}\n')
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "training_loss.png").write_bytes(b"\x89PNG")
    tracking.log_artifacts(run_id, tmp_path / "trainer_log.jsonl")
    tracking.log_artifacts(run_id, plots, "plots")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    tracking.log_and_register_model(run_id, model, None, {}, "AutoModelForCausalLM.from_pretrained(path)",
                                    {"model_name_or_path": "base"}, ["transformers"])
    tracking.log_metrics(run_id, {"eval_loss": 0.25})
    version = tracking.register_model(run_id, "tiny-http", {"dataset_fingerprint": "fp1"})

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    run = client.get_run(run_id)
    assert run.data.params == {"training.learning_rate": "0.1", "model.hf_hub_token": "***"}
    assert tracking.metric_history(uri, run_id, "loss") == [(s, 5.0 - s) for s in range(1, 6)]
    names = {a.path for a in client.list_artifacts(run_id)}
    assert {"trainer_log.jsonl", "plots", "model"} <= names
    stored = list((server.root / "artifacts").rglob("training_loss.png"))  # proxied: the server wrote it
    assert len(stored) == 1 and stored[0].read_bytes() == b"\x89PNG"
    mv = client.get_model_version("tiny-http", version)
    assert mv.run_id == run_id and mv.tags["dataset_fingerprint"] == "fp1" and mv.tags["metric.eval_loss"] == "0.25"
    assert tracking.run_url(uri, run_id) == (f"{uri}/#/experiments/{run.info.experiment_id}/runs/{run_id}"
                                             "?workflowType=machine_learning")
    tracking.finish_run(run_id)
    assert client.get_run(run_id).info.status == "FINISHED"


# --- the server drops during training, and comes back ----------------------------------------------------------


def test_server_lost_during_training_metrics_spooled_then_sent_none_lost(server, tmp_path, fake_checkpoint):
    uri = server.uri
    run_id = tracking.open_run(uri, "http-outage", "work-2", "outage", {})
    out = tmp_path / "out"
    assert tracking.log_checkpoint(run_id, fake_checkpoint(out, 5), train_key="k") == "checkpoints/checkpoint-5"
    # what training uses: the spooling logger behind its worker thread
    logger = tracking.BackgroundStepLogger(lambda: tracking.StepMetricLogger(run_id, uri, out, retry_interval_s=0.5))
    for step in range(1, 6):
        logger.log({"loss": float(step)}, step)
    logger.flush()

    server.stop()
    sizes, start = [], time.monotonic()
    for step in range(6, 16):
        logger.log({"loss": float(step), "grad_norm": step / 10}, step)  # never raises: training goes on
        logger.flush()
        sizes.append((out / SPOOL_NAME).stat().st_size)
        time.sleep(0.1)
    assert time.monotonic() - start < 10  # a down server costs milliseconds per step, not HTTP retries
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    start = time.monotonic()
    assert tracking.log_checkpoint(run_id, fake_checkpoint(out, 10)) is None  # skipped with a warning
    assert time.monotonic() - start < 2
    assert spooled_count(run_id, out) == 20  # still down: every value waits in the spool
    spooled = [json.loads(line) for line in (out / SPOOL_NAME).read_text().splitlines()]
    assert sorted({e["step"] for e in spooled}) == list(range(6, 16))

    server.start()  # same port, same backend
    assert tracking.flush_spool(run_id, uri, out) == 0
    assert not (out / SPOOL_NAME).exists()
    logger.log({"loss": 16.0, "grad_norm": 1.6}, 16)  # the live logger carries on straight to the server
    assert logger.close() == 0
    assert tracking.metric_history(uri, run_id, "loss") == [(s, float(s)) for s in range(1, 17)]
    assert tracking.metric_history(uri, run_id, "grad_norm") == [(s, s / 10) for s in range(6, 17)]
    assert tracking.download_latest_checkpoint(run_id, uri, tmp_path / "fresh") == tmp_path / "fresh/checkpoint-5"
    # pruning to save_total_limit works through the server's artifact proxy too
    assert tracking.log_checkpoint(run_id, fake_checkpoint(out, 20), train_key="k") == "checkpoints/checkpoint-20"
    assert tracking.prune_logged_checkpoints(run_id, 1, tracking_uri=uri) == ["checkpoint-5"]
    assert tracking.download_latest_checkpoint(run_id, uri, tmp_path / "again") == tmp_path / "again/checkpoint-20"
