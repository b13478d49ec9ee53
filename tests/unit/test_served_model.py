"""A registered version is an MLflow model: `mlflow.pyfunc.load_model` answers with it, and `mlflow models serve`
serves it, through the training template, as `tuneline chat` would answer.

The version is recorded as the finetune flow records it (start_run, record_training, record_results against a real
SQLite store, the artifacts beside it); a random LoRA adapter on the tiny model stands for the trained one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from ports import free_port
from test_chat import greedy_answer
from test_export import make_adapter

from tuneline import tracking
from tuneline.errors import UserError
from tuneline.training_contract import die_with_parent

NAME = "tiny-chat"
QUESTION = "add two and three"


@pytest.fixture(scope="module")
def registered(tiny_model_dir, demo_data_dir, empty_mlflow_store, tmp_path_factory):
    """(tracking URI, the trained adapter): version 1 of NAME, with the `champion` alias; the trained output_dir
    is deleted, so everything that answers comes from the store."""
    from tuneline.config import load_config
    from tuneline.pipeline import keys
    from tuneline.pipeline.record import record_results, record_training, start_run

    root = tmp_path_factory.mktemp("served")
    shutil.copyfile(empty_mlflow_store, root / "mlflow.db")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    out = make_adapter(tiny_model_dir, root / "out", seed=3, targets=("q_proj", "v_proj", "down_proj"))
    adapter = shutil.copytree(out, root / "adapter")
    config = load_config(None, {"model_name_or_path": str(tiny_model_dir), "stage": "sft", "dataset": "demo_sft",
                                "dataset_dir": str(demo_data_dir), "template": "chatml", "output_dir": str(out),
                                "do_sample": False, "max_new_tokens": 6, "mlflow_tracking_uri": uri,
                                "mlflow_registered_model": NAME}, check_paths=False)
    dataset_fp = keys.dataset_key(config)
    run = start_run(config, dataset_fp, None, None)
    record_training(run, config, {"output_dir": str(out)})
    assert record_results(run, config, {}, {}, dataset_fp) == "1"
    tracking.set_alias(uri, NAME, "champion", "1")
    shutil.rmtree(out)
    return uri, adapter


def test_the_champion_loads_with_mlflow_pyfunc_and_answers_through_the_training_template(
        registered, tiny_model_dir, monkeypatch):
    import mlflow

    uri, adapter = registered
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    model = mlflow.pyfunc.load_model(f"models:/{NAME}@champion")
    expected = greedy_answer(tiny_model_dir, adapter, QUESTION)
    assert model.predict({"prompt": QUESTION}) == [expected]
    assert model.predict({"messages": [{"role": "user", "content": QUESTION}]}) == [expected]
    assert model.metadata.get_input_schema().input_names() == ["messages", "prompt", "system"]

    shorter = mlflow.pyfunc.load_model(f"models:/{NAME}/1", model_config={"max_new_tokens": 2})
    assert expected.startswith(shorter.predict({"prompt": QUESTION})[0]), "model_config keys change the config"
    with pytest.raises(UserError, match="LoRA adapter on the base '/nowhere/base', which is not on this machine"):
        mlflow.pyfunc.load_model(f"models:/{NAME}/1", model_config={"model_name_or_path": "/nowhere/base"})


def test_each_input_row_is_a_conversation():
    import pandas as pd

    from tuneline.serving_model import ServedChat, conversation

    said = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert conversation({"messages": said}) == ([{"role": "user", "content": "hi"}], "be brief")
    assert conversation({"prompt": "hi", "messages": float("nan"), "system": float("nan")}) == (said[1:], None)
    with pytest.raises(UserError, match="needs 'messages'"):
        conversation({"question": "hi"})
    with pytest.raises(UserError, match="got none of them"):  # what MLflow's schema check leaves of unknown keys
        ServedChat(chat=None).predict(pd.DataFrame(index=[0]))


def test_the_registered_files_still_load_as_the_trainers_output(registered, tiny_model_dir, tmp_path):
    """What retrain's champion scoring and `tuneline export` read: the adapter as the trainer saved it."""
    uri, adapter = registered
    files = tracking.download_version(uri, NAME, "1", tmp_path / "v1")
    assert (files / "adapter_config.json").is_file() and (files / "adapter_model.safetensors").read_bytes() == \
        (adapter / "adapter_model.safetensors").read_bytes()
    assert tracking.download_version(uri, NAME, "1", tmp_path / "v1") == files, "fetched once"
    from mlflow import MlflowClient

    version = MlflowClient(tracking_uri=uri, registry_uri=uri).get_model_version(NAME, "1")
    assert version.tags["tuneline.base_model"] == str(Path(tiny_model_dir).resolve()), "the adapter's base"


def test_mlflow_models_serve_answers_a_generation_request(registered, tiny_model_dir, tmp_path):
    """`mlflow models serve` of the champion in its own process, stopped by its pid after one request."""
    uri, adapter = registered
    port = free_port()
    venv_bin = Path(sys.executable).parent  # mlflow starts `uvicorn` from PATH, as in an activated venv
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = [str(venv_bin / "mlflow"), "models", "serve", "-m", f"models:/{NAME}@champion",
               "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]
    with open(tmp_path / "serve.log", "wb") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                  preexec_fn=lambda: die_with_parent(signal.SIGTERM))
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=1)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                time.sleep(0.5)
        body = json.dumps({"dataframe_records": [{"prompt": QUESTION}]}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                         headers={"Content-Type": "application/json"})
        answer = json.loads(urllib.request.urlopen(request, timeout=60).read())
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
    assert answer == {"predictions": [greedy_answer(tiny_model_dir, adapter, QUESTION)]}
