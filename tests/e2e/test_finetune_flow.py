"""The whole flow against a real Prefect API and a real MLflow SQLite store, on the tiny model."""

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.support.flows import REPO, STEPS, flow_artifacts, run_flow


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("flow")
    shutil.copytree(REPO / "data", root / "data")
    config = {
        "model_name_or_path": str(tiny_model_dir), "stage": "sft", "finetuning_type": "lora", "lora_rank": 8,
        "dataset": "demo_sft", "eval_dataset": "demo_sft_eval", "dataset_dir": str(root / "data"),
        "template": "chatml", "cutoff_len": 64, "max_samples": 256,
        "output_dir": str(root / "out"), "logging_steps": 2, "save_steps": 10, "max_steps": 20,
        "per_device_train_batch_size": 8, "learning_rate": 3.0e-3, "per_device_eval_batch_size": 16,
        "pipeline_cache_dir": str(root / "cache"), "mlflow_tracking_uri": f"sqlite:///{root / 'mlflow.db'}",
        "mlflow_experiment": "flow-test", "mlflow_registered_model": "flow-test-model",
        "eval_max_samples": 16, "eval_max_new_tokens": 4,
    }
    path = root / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    return root, path


def thread_priorities() -> dict[int, int]:
    """{thread id: nice value} of this process's threads (Linux keeps one per thread)."""
    import os

    out = {}
    for name in os.listdir("/proc/self/task"):
        try:
            out[int(name)] = os.getpriority(os.PRIO_PROCESS, int(name))
        except OSError:  # ended meanwhile
            continue
    return out


def test_flow_trains_tracks_and_caches(prefect_api, workdir):
    from mlflow import MlflowClient
    from prefect.automations import Automation

    from orchestration.crash_detection import AUTOMATION_NAME

    root, config_path = workdir
    before = thread_priorities()
    result, states = run_flow(config_path)
    after = thread_priorities()
    assert {tid: nice for tid, nice in after.items() if tid in before} == {
        tid: nice for tid, nice in before.items() if tid in after}, "a flow run leaves this process's priorities alone"
    assert set(after.values()) <= set(before.values()), "and its threads run at this process's priority"
    assert set(states) == STEPS
    assert Automation.read(name=AUTOMATION_NAME).trigger.within.total_seconds() == 3 * 180, "crashes get noticed"
    train_logs = task_logs(result["flow_run_id"], "train")
    assert any("'loss'" in line for line in train_logs), "the training's lines reach the Prefect API"
    assert result["tuned"]["eval_loss"] < result["base"]["eval_loss"], "training must lower eval loss"

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    run = client.get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["learning_rate"] == "0.003" and run.data.params["stage"] == "sft"
    flow_run_id = str(result["flow_run_id"])
    assert run.data.tags["prefect.flow_run_url"].startswith("http") and flow_run_id in run.data.tags["prefect.flow_run_url"]
    assert run.data.tags["mlflow.user"] and run.data.tags["mlflow.source.type"] == "JOB", "the UI's User and Source"
    [data] = run.inputs.dataset_inputs
    assert data.dataset.name == "demo_sft" and json.loads(data.dataset.profile)["data_train_rows"] > 0
    losses = client.get_metric_history(run.info.run_id, "loss")
    steps = [m.step for m in losses]
    assert steps and steps == sorted(set(steps)), "train loss logged once per logging step, by global step"
    assert run.data.metrics["final_eval_loss"] < run.data.metrics["base_eval_loss"]
    assert run.data.metrics["data_train_rows"] == 256 and run.data.metrics["data_tokens"] > 0
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"model", "plots", "README.md", "tuneline_config.yaml", "trainer_log.jsonl", "evaluation"} <= artifacts
    for name, prefix in (("base", "base_"), ("tuned", "final_")):  # each evaluation's answers and metrics
        folder = Path(client.download_artifacts(run.info.run_id, f"evaluation/{name}", str(root / "downloaded")))
        answers = [json.loads(line) for line in (folder / "generated_predictions.jsonl").read_text().splitlines()]
        assert len(answers) == 16 and all(set(row) == {"prompt", "predict", "label"} for row in answers)
        scores = json.loads((folder / "metrics.json").read_text())
        assert scores["eval_loss"] == pytest.approx(run.data.metrics[f"{prefix}eval_loss"])
    assert (root / "out" / "README.md").is_file() and (root / "out" / "training_loss.png").is_file()
    assert client.get_registered_model("flow-test-model").latest_versions
    artifacts = flow_artifacts(result["flow_run_id"])
    assert {"run-summary", "evaluation", "loss-plot"} <= set(artifacts)
    link = (f"[{run.info.run_id}](http://127.0.0.1:5000/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
            "?workflowType=machine_learning)")
    assert link in artifacts["run-summary"] and link in (root / "out" / "README.md").read_text()
    assert training_progress(result["flow_run_id"]) == 100.0

    # the same command again: every step is a cache hit, and the MLflow record is the same run
    again, states = run_flow(config_path)
    assert all(set(s) == {"Cached"} for s in states.values()), states
    assert again["mlflow_run_id"] == result["mlflow_run_id"]

    # only learning_rate changes: upstream steps hit, train and everything after it run again
    _, states = run_flow(config_path, ["learning_rate=1.0e-3", f"output_dir={root / 'out_lr'}"])
    for name in ("load-tokenizer", "build-dataset", "build-reference-model"):
        assert states[name] == ["Cached"], (name, states)
    assert states["train"] == ["Completed"] and "Completed" in states["evaluate"]

    # a data file changes: the dataset is rebuilt and everything after it reruns
    data_file = root / "data" / "demo_sft.json"
    rows = json.loads(data_file.read_text())
    data_file.write_text(json.dumps(rows[:-1]))
    _, states = run_flow(config_path, [f"output_dir={root / 'out_data'}"])
    assert states["load-tokenizer"] == ["Cached"]
    assert states["build-dataset"] == ["Completed"] and states["train"] == ["Completed"], states

    # --no-cache: every step runs again, train from step 0 (its old checkpoints are gone)
    _, states = run_flow(config_path, [f"output_dir={root / 'out_data'}", "refresh_cache=true"])
    assert all(set(s) == {"Completed"} for s in states.values()), states
    log = [json.loads(line) for line in (root / "out_data" / "trainer_log.jsonl").read_text().splitlines()]
    assert log[0]["current_steps"] <= 2, "a forced rerun trains from the start, it does not resume"


def task_logs(flow_run_id, task_name: str) -> list[str]:
    """The messages the Prefect API holds for one task of a flow run, page by page."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterTaskRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # Prefect's log worker sends its batch now

    async def read():
        async with get_client() as client:
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            ids = [run.id for run in runs if run.name.split(" ")[0] == task_name]
            messages: list[str] = []
            while page := await client.read_logs(LogFilter(task_run_id=LogFilterTaskRunId(any_=ids)), limit=200,
                                                 offset=len(messages)):
                messages += [log.message for log in page]
        return messages

    return asyncio.run(read())


def training_progress(flow_run_id) -> float | None:
    """The train step's progress artifact, as the Prefect API holds it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterType, FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=["progress"])),
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))

    found = asyncio.run(read())
    return found[0].data if len(found) == 1 else None


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    assert files, f"no weights in {folder}"
    out = {}
    for file in files:
        out.update(load_file(str(file)))
    return out


def wait_for(path: Path, proc, seconds: float = 300) -> None:
    import time

    deadline = time.time() + seconds
    while not path.is_dir():
        assert proc.poll() is None, f"the flow ended before {path.name} appeared"
        assert time.time() < deadline, f"no {path.name} within {seconds} s"
        time.sleep(0.2)


def assert_same_weights(left: Path, right: Path) -> None:
    a, b = _weights(left), _weights(right)
    assert a.keys() == b.keys()
    for name in a:
        assert (a[name] - b[name]).abs().max().item() <= 1e-6, name


def test_sigkill_during_train_then_same_command_resumes_in_same_mlflow_run(prefect_api, workdir):
    """Kill the whole flow process group mid-training; the same command, with only `logging_steps` raised, must
    finish it as if never killed, in the same MLflow run, which records the change."""
    import os
    import signal
    import subprocess
    import sys

    from mlflow import MlflowClient
    from prefect.settings import PREFECT_API_URL

    root, config_path = workdir
    killed_dir, whole_dir = root / "killed", root / "whole"
    overrides = [f"output_dir={killed_dir}", "max_steps=30", "save_steps=10", "mlflow_registered_model=null"]
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    proc = subprocess.Popen([sys.executable, "-m", "flows.finetune", str(config_path), *overrides], env=env,
                            cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(killed_dir / "checkpoint-10", proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_run = json.loads((killed_dir / "run.json").read_text())
    killed_run_id = killed_run["mlflow_run_id"]
    assert killed_run["status"] != "complete"

    resumed, states = run_flow(config_path, [*overrides, "logging_steps=5"])  # the workdir's config logs every 2
    for name in ("load-tokenizer", "build-dataset", "build-reference-model"):
        assert states[name] == ["Cached"], (name, states)
    assert states["train"] == ["Completed"]

    whole, _ = run_flow(config_path, [f"output_dir={whole_dir}", *overrides[1:]])
    assert_same_weights(killed_dir, whole_dir)

    # only the training process dies (the flow lives): the task's Prefect retry resumes it within the flow run
    retry_dir = root / "retried"
    proc = subprocess.Popen([sys.executable, "-m", "flows.finetune", str(config_path), f"output_dir={retry_dir}",
                             *overrides[1:]], env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(retry_dir / "checkpoint-10", proc)
    trainer_pid = json.loads((retry_dir / "run.json").read_text())["pid"]  # the child's (the flow holds the lock)
    os.kill(trainer_pid, signal.SIGKILL)
    assert proc.wait(timeout=300) == 0, "the flow must finish through the train task's retry"
    assert_same_weights(retry_dir, whole_dir)

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    assert resumed["mlflow_run_id"] == killed_run_id, "the killed start and the resume share one MLflow run"
    run = client.get_run(killed_run_id)
    assert len(run.data.tags["tuneline.flow_run_ids"].split(",")) == 2
    first, newest = run.data.params["logging_steps"], run.data.tags["tuneline.resumed_with.logging_steps"]
    assert (float(first), float(newest)) == (2, 5), "the param keeps the first value, a tag holds the new one"
    assert run.data.tags["tuneline.resume_changes"] == "logging_steps"
    assert whole["mlflow_run_id"] != killed_run_id, "a finished run never stands for other work (its logging)"
    steps = sorted(m.step for m in client.get_metric_history(killed_run_id, "loss"))
    assert len(steps) == len(set(steps)), "every logged step once, also across the kill"
    # every 2nd step up to the checkpoint (and those logged before the kill came), then every 5th
    assert steps[:5] == [2, 4, 6, 8, 10] and set(steps[5:-4]) <= {12, 14} and steps[-4:] == [15, 20, 25, 30]
