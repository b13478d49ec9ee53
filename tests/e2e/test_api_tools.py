"""`tuneline api models:/NAME@champion` on a tiny agent, called with the real `openai` client: a call comes back as
`tool_calls`, the `tool` answer goes in, and the next turn reads it.

The agent is honest: the tiny model is trained (`python -m tuneline.train`, full fine-tuning, the real data step)
on one row of LLaMA-Factory's tool-call demo until it has learned it by heart, with the qwen template. Asked that
row's question with that row's tool, it writes the call in qwen's tool format; the server reads the call back with
the template's own parser. Registered as the flow registers a run, the trained folder then deleted, so what answers
comes from the MLflow store."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.support.api_server import api_server, client
from tests.support.serving import register_champion

LF_DATA = "/work/shared/llamafactory-data"
ROW = 203  # the shortest row of glaive_toolcall_en_demo.json with a call, its result and an answer
NAME = "tiny-agent"


def demo_row(root):
    """A dataset folder holding that one row, registered as LLaMA-Factory registers the demo."""
    from pathlib import Path

    row = json.loads((Path(LF_DATA) / "glaive_toolcall_en_demo.json").read_text())[ROW]
    info = json.loads((Path(LF_DATA) / "dataset_info.json").read_text())["glaive_toolcall_en_demo"]
    (root / "one_call.json").write_text(json.dumps([row]))
    (root / "dataset_info.json").write_text(json.dumps({"one_call": {**info, "file_name": "one_call.json"}}))
    return row


@pytest.fixture(scope="module")
def agent(tiny_model_dir, empty_mlflow_store, tmp_path_factory):
    """(base URL, the learned row, the tracking URI) of `tuneline api` on the registered champion of the trained agent."""
    from tuneline.config import load_config
    from tuneline.data import build_dataset

    root = tmp_path_factory.mktemp("agent")
    row = demo_row(root)
    shutil.copyfile(empty_mlflow_store, root / "mlflow.db")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    values = {"model_name_or_path": str(tiny_model_dir), "stage": "sft", "finetuning_type": "full",
              "template": "qwen", "dataset": "one_call", "dataset_dir": str(root), "output_dir": str(root / "out"),
              "cutoff_len": 1024, "per_device_train_batch_size": 1, "learning_rate": 3e-3, "max_steps": 50,
              "lr_scheduler_type": "constant", "save_steps": 1000, "logging_steps": 10, "seed": 7,
              "pipeline_cache_dir": str(root / "cache"), "dataloader_num_workers": 0, "do_sample": False,
              "max_new_tokens": 64, "mlflow_tracking_uri": uri, "mlflow_registered_model": NAME}
    path = root / "agent.yaml"
    path.write_text(yaml.safe_dump(values))
    config = load_config(path)
    dataset = build_dataset(config)
    subprocess.run([sys.executable, "-m", "tuneline.train", str(path), "--dataset", dataset["path"]], check=True,
                   capture_output=True)
    register_champion(config, root / "out")
    with api_server([f"models:/{NAME}@champion"], root / "api.log", MLFLOW_TRACKING_URI=uri) as url:
        yield url, row, uri


def openai_tools(row) -> list[dict]:
    return [{"type": "function", "function": spec} for spec in json.loads(row["tools"])]


def test_the_call_comes_back_as_tool_calls_and_the_tool_result_is_read(agent, monkeypatch):
    import mlflow

    url, row, uri = agent
    question, call, result, answer = (turn["value"] for turn in row["conversations"])
    said = [{"role": "user", "content": question}]
    first = client(url).chat.completions.create(model=NAME, messages=said, tools=openai_tools(row))
    [made] = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls" and first.choices[0].message.content is None
    assert {"name": made.function.name, "arguments": json.loads(made.function.arguments)} == json.loads(call)

    said += [first.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": made.id, "content": result}]
    second = client(url).chat.completions.create(model=NAME, messages=said, tools=openai_tools(row))
    assert second.choices[0].message.content == answer, "the next turn read the tool's result"
    assert not second.choices[0].message.tool_calls

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    registered = mlflow.pyfunc.load_model(f"models:/{NAME}@champion")
    assert registered.predict({"messages": said, "tools": openai_tools(row)}) == [{"answer": answer,
                                                                                  "tool_calls": []}], \
        "the MLflow model answers the same"


def test_a_streamed_call_comes_back_as_one_tool_calls_delta(agent):
    url, row, _ = agent
    question, call, _, _ = (turn["value"] for turn in row["conversations"])
    chunks = list(client(url).chat.completions.create(model=NAME, messages=[{"role": "user", "content": question}],
                                                      tools=openai_tools(row), stream=True))
    calls = [call for chunk in chunks for call in chunk.choices[0].delta.tool_calls or []]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [tuple(json.loads(call).values())]
    assert not any(chunk.choices[0].delta.content for chunk in chunks), "the call's text is not streamed as content"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
