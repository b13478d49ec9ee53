"""A registered version is an MLflow model: `mlflow.pyfunc.load_model` answers with it, and `mlflow models serve`
serves it, through the training template, as `tuneline chat` would answer.

The version is recorded as the finetune flow records it (start_run, record_training, record_results against a real
SQLite store, the artifacts beside it); a random LoRA adapter on the tiny model stands for the trained one.
"""

from __future__ import annotations

import contextlib
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
from test_chat import ADD, greedy_answer, scripted_agent
from test_export import make_adapter

from tuneline import tracking
from tuneline.errors import UserError
from tuneline.training_contract import die_with_parent

NAME = "tiny-chat"
PNG_1X1 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")
QUESTION = "add two and three"
OPENAI_TOOL_TURNS = [{"role": "user", "content": QUESTION},
                     {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                      "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "5"}]


@pytest.fixture(scope="module")
def registered(tiny_model_dir, demo_data_dir, empty_mlflow_store, tmp_path_factory):
    """(tracking URI, the trained adapter): version 1 of NAME, with the `champion` alias; the trained output_dir
    is deleted, so everything that answers comes from the store."""
    from tuneline.config import load_config

    root = tmp_path_factory.mktemp("served")
    shutil.copyfile(empty_mlflow_store, root / "mlflow.db")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    out = make_adapter(tiny_model_dir, root / "out", seed=3, targets=("q_proj", "v_proj", "down_proj"))
    adapter = shutil.copytree(out, root / "adapter")
    config = load_config(None, {"model_name_or_path": str(tiny_model_dir), "stage": "sft", "dataset": "demo_sft",
                                "dataset_dir": str(demo_data_dir), "template": "chatml", "output_dir": str(out),
                                "do_sample": False, "max_new_tokens": 6, "mlflow_tracking_uri": uri,
                                "mlflow_registered_model": NAME}, check_paths=False)
    register_champion(config, out)
    return uri, adapter


def register_champion(config, out: Path) -> None:
    """Version 1 of the config's registered model, recorded as the flow records it, with the `champion` alias; `out`
    (the trained output_dir) is deleted, so everything that answers comes from the store."""
    from tuneline.pipeline import keys
    from tuneline.pipeline.record import record_results, record_training, start_run
    from tuneline.pipeline.records import TrainResult

    dataset_fp = keys.dataset_key(config)
    run = start_run(config, dataset_fp, None, None)
    record_training(run, config, TrainResult(str(out), "trained-here"))
    assert record_results(run, config, {}, {}, dataset_fp) == "1"
    uri, name = config.pipeline.mlflow_tracking_uri, config.pipeline.mlflow_registered_model
    tracking.set_alias(uri, name, "champion", "1")
    shutil.rmtree(out)


def test_the_champion_loads_with_mlflow_pyfunc_and_answers_through_the_training_template(
        registered, tiny_model_dir, monkeypatch):
    import mlflow

    uri, adapter = registered
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    model = mlflow.pyfunc.load_model(f"models:/{NAME}@champion")
    expected = {"answer": greedy_answer(tiny_model_dir, adapter, QUESTION), "tool_calls": []}
    assert model.predict({"prompt": QUESTION}) == [expected]
    assert model.predict({"messages": [{"role": "user", "content": QUESTION}]}) == [expected]
    assert model.metadata.get_input_schema().input_names() == ["messages", "prompt", "system", "tools", "images"]

    shorter = mlflow.pyfunc.load_model(f"models:/{NAME}/1", model_config={"max_new_tokens": 2})
    assert expected["answer"].startswith(shorter.predict({"prompt": QUESTION})[0]["answer"]), \
        "model_config keys change the config"
    with pytest.raises(UserError, match="images were given, but 'template: chatml' reads text only"):
        model.predict({"prompt": QUESTION, "images": [PNG_1X1]})
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


def test_openai_tool_messages_take_the_templates_roles():
    from tuneline.serving_model import conversation

    said = [dict(message) for message in OPENAI_TOOL_TURNS]
    assert conversation({"messages": said}) == ([
        said[0], {"role": "function", "content": '[{"name": "add", "arguments": {"a": 2, "b": 3}}]'},
        {"role": "observation", "content": "5"}], None)
    with pytest.raises(UserError, match="message 2 is a 'user' message where one of \\['assistant', 'function'\\]"):
        conversation({"messages": [said[0], said[0]]})
    with pytest.raises(UserError, match="must end on a user or tool message"):
        conversation({"messages": said[:2]})
    with pytest.raises(UserError, match="the arguments of the tool call 'add' are not JSON"):
        conversation({"messages": [said[0], {"role": "assistant", "tool_calls": [{"function": {
            "name": "add", "arguments": "{a: 2"}}]}, said[2]]})


def test_a_request_with_tools_answers_with_the_calls_parsed(registered, tiny_model_dir, monkeypatch):
    """The registered model, loaded by MLflow and its signature enforced on the request; only the generated ids are
    scripted, as a trained agent's call (chatml writes tools ReAct-style, LLaMA-Factory's `default` format)."""
    import mlflow

    uri, _ = registered
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    model = mlflow.pyfunc.load_model(f"models:/{NAME}@champion")
    prompts = scripted_agent(monkeypatch, tiny_model_dir, 'Action: add\nAction Input: {"a": 2, "b": 3}', "It is 5.")
    asked = [{"role": "user", "content": QUESTION}]
    call = {"name": "add", "arguments": {"a": 2, "b": 3}}
    assert model.predict({"messages": asked, "tools": [ADD]}) == [
        {"answer": 'Action: add\nAction Input: {"a": 2, "b": 3}', "tool_calls": [call]}]
    assert "> Tool Name: add\nTool Description: Add two numbers\n" in prompts[0]
    assert model.predict({"messages": OPENAI_TOOL_TURNS, "tools": json.dumps([ADD])}) == [
        {"answer": "It is 5.", "tool_calls": []}], "tools as JSON text; an answer with no call"
    assert ('<|im_start|>assistant\nAction: add\nAction Input: {"a": 2, "b": 3}<|im_end|>\n<|im_start|>tool\n5'
            '<|im_end|>\n<|im_start|>assistant\n') in prompts[1], "the OpenAI call and result, in chatml's words"
    with pytest.raises(UserError, match="the request's 'tools': tool 1 of the list must be an object with a 'name'"):
        model.predict({"prompt": QUESTION, "tools": [{"description": "adds"}]})


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
    with model_server(uri, f"models:/{NAME}@champion", tmp_path / "serve.log") as port:
        answer = invoke(port, {"dataframe_records": [{"prompt": QUESTION}]})
        with_tools = invoke(port, {"inputs": {"messages": OPENAI_TOOL_TURNS, "tools": [ADD]}})
    assert answer == {"predictions": [{"answer": greedy_answer(tiny_model_dir, adapter, QUESTION), "tool_calls": []}]}
    [row] = with_tools["predictions"]
    assert isinstance(row["answer"], str) and row["tool_calls"] == [], "the signature lets tools and their turns in"


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
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=1)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.5)
        yield port
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


def invoke(port: int, payload: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=60).read())
