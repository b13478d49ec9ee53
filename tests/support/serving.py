"""The served-model tests' steps: a version registered as the flow registers it, `mlflow models serve` in its own
process, and a request to it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.support.ports import free_port, wait_until_answers
from tuneline import tracking
from tuneline.runtime.contract import die_with_parent

# A 1 x 1 PNG, base64: an image part the served models take.
PNG_1X1 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")

def register_champion(config, out: Path) -> None:
    """Version 1 of the config's registered model, recorded as the flow records it, with the `champion` alias; `out`
    (the trained output_dir) is deleted, so everything that answers comes from the store."""
    from tuneline.content.records import Evaluation
    from tuneline.identity import keys
    from tuneline.pipeline.record import record_results, record_training, start_run
    from tuneline.pipeline.records import TrainResult

    dataset_fp = keys.dataset_key(config)
    run = start_run(config, dataset_fp, None, None)
    record_training(run, config, TrainResult(str(out), "trained-here"))
    assert record_results(run, config, Evaluation("base"), Evaluation("tuned"), dataset_fp) == "1"
    uri, name = config.pipeline.mlflow_tracking_uri, config.pipeline.mlflow_registered_model
    tracking.set_alias(uri, name, "champion", "1")
    shutil.rmtree(out)


@contextlib.contextmanager
def model_server(uri: str, model_uri: str, log_path: Path):
    """The port of `mlflow models serve` of `model_uri`, in its own process, stopped by its pid on leaving."""
    port = free_port()
    venv_bin = Path(sys.executable).parent  # mlflow starts `uvicorn` from PATH, as in an activated venv
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = [str(venv_bin / "mlflow"), "models", "serve", "-m", model_uri,
               "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                  preexec_fn=lambda: die_with_parent(signal.SIGTERM))
    try:
        wait_until_answers(f"http://127.0.0.1:{port}/ping", server, log_path, 120, "mlflow models serve")
        yield port
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


def invoke(port: int, payload: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=60).read())
