"""A 2x2 dpo sweep on the tiny model against a real Prefect API and MLflow store: one parent run with four nested
children, the shared steps built once and cached for every point, the comparison on the parent and in Prefect,
the best child tagged; and a sweep with a bad grid refused before anything is created."""

import asyncio
import json
import shutil
import time

import pytest
import yaml

from tests.support.flows import REPO, flow_artifacts, task_states

GRID = {"learning_rate": "3e-3,1e-3", "pref_beta": [0.1, 0.3]}


@pytest.fixture(scope="module")
def root(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("sweep")
    shutil.copytree(REPO / "data", root / "data")
    config = {"model_name_or_path": str(tiny_model_dir), "stage": "dpo", "finetuning_type": "lora", "lora_rank": 8,
              "dataset": "demo_pref", "eval_dataset": "demo_pref_eval", "dataset_dir": str(root / "data"),
              "template": "chatml", "cutoff_len": 64, "max_samples": 16, "max_steps": 2, "logging_steps": 1,
              "save_steps": 10, "per_device_train_batch_size": 8, "per_device_eval_batch_size": 16,
              "learning_rate": 3.0e-3, "output_dir": str(root / "dpo"), "pipeline_cache_dir": str(root / "cache"),
              "mlflow_tracking_uri": f"sqlite:///{root / 'mlflow.db'}", "mlflow_experiment": "sweep-test",
              "eval_max_samples": 8}
    (root / "dpo.yaml").write_text(yaml.safe_dump(config))
    return root


def _child_flow_runs(flow_run_id) -> list:
    """The ids of the finetune subflows a sweep started (each inside a sweep-point task)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    async def read():
        async with get_client() as client:
            return await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])))

    return [run.id for run in asyncio.run(read())]


def _train_intervals(flow_run_ids) -> list[tuple[float, float]]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterName

    async def read():
        async with get_client() as client:
            return await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(flow_run_ids))),
                task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="train")))

    return sorted((run.start_time.timestamp(), run.end_time.timestamp()) for run in asyncio.run(read())
                  if run.start_time and run.end_time)


@pytest.fixture
def two_gpu_slots(prefect_api, monkeypatch):
    """The `gpu` limit, created by the sweep with two slots, removed afterwards for other tests."""
    from prefect.client.orchestration import get_client

    from orchestration.concurrency import GPU_TAG, SLOTS_ENV

    monkeypatch.setenv(SLOTS_ENV, "2")
    yield

    async def delete():
        async with get_client() as client:
            await client.delete_concurrency_limit_by_tag(GPU_TAG)

    asyncio.run(delete())


def test_two_by_two_sweep_nests_four_runs_shares_steps_and_tags_the_best(root, two_gpu_slots):
    from mlflow import MlflowClient

    from flows.sweep import sweep
    from tuneline.evaluation.metric_names import STAGE_METRICS

    started = time.monotonic()
    state = sweep(str(root / "dpo.yaml"), GRID, max_parallel=2, return_state=True)
    assert state.is_completed(), state.message
    result, flow_run_id = state.result(), state.state_details.flow_run_id
    print(f"2x2 sweep: {time.monotonic() - started:.1f} s")

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    parent = client.get_run(result["mlflow_run_id"])
    experiment = client.get_experiment_by_name("sweep-test").experiment_id
    assert parent.info.experiment_id == experiment and parent.info.status == "FINISHED"
    children = client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert len(children) == 4
    points = {(c.data.params["learning_rate"], c.data.params["pref_beta"]) for c in children}
    assert points == {("0.003", "0.1"), ("0.003", "0.3"), ("0.001", "0.1"), ("0.001", "0.3")}, "plain params"
    assert {c.info.status for c in children} == {"FINISHED"}
    assert len({c.data.params["output_dir"] for c in children}) == 4, "each point trains in its own folder"

    best = [c for c in children if c.data.tags.get("tuneline.sweep_best") == "true"]
    assert len(best) == 1 and sum(c.data.tags.get("tuneline.sweep_best") == "false" for c in children) == 3
    [best] = best
    assert best.data.metrics["final_eval_loss"] == min(c.data.metrics["final_eval_loss"] for c in children)
    assert parent.data.tags["tuneline.sweep_best_run_id"] == best.info.run_id == result["best_run_id"]
    assert set(result["rows"][0]) >= {"point", "learning_rate", "pref_beta", "run_id", "final_eval_loss",
                                      "final_reward_accuracy", "train_loss", "loss"}
    assert {k[len("final_"):] for k in best.data.metrics if k.startswith("final_")} == set(STAGE_METRICS["dpo"])

    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {f"sweep_comparison.{ext}" for ext in ("md", "csv", "json")} <= artifacts
    table = client.download_artifacts(parent.info.run_id, "sweep_comparison.md", str(root / "dl"))
    assert best.info.run_id in open(table).read()
    prefect_table = json.loads(flow_artifacts(flow_run_id)["sweep-comparison"])
    assert len(prefect_table) == 4 and {row["run_id"] for row in prefect_table} == {c.info.run_id for c in children}

    # the shared steps ran once, in the sweep itself; every point found them cached
    sweep_states = task_states(flow_run_id)
    for name in ("load-tokenizer", "build-dataset", "build-reference-model"):
        assert sweep_states[name] == ["Completed"], (name, sweep_states)
    subflows = _child_flow_runs(flow_run_id)
    assert len(subflows) == 4
    for subflow in subflows:
        states = task_states(subflow)
        for name in ("load-tokenizer", "build-dataset", "build-reference-model"):
            assert states[name] == ["Cached"], (name, states)
        assert "Cached" in states["evaluate"], "the base model's evaluation is shared"
        assert states["train"] == ["Completed"]
    intervals = _train_intervals(subflows)
    assert len(intervals) == 4
    assert max(sum(start <= moment < end for start, end in intervals) for moment, _ in intervals) == 2, \
        "two points in flight, two gpu slots: two trainings at a time, never more"

    # the same sweep again: the same parent and children, every point's training cached
    started = time.monotonic()
    again = sweep(str(root / "dpo.yaml"), GRID, max_parallel=2)
    print(f"the same sweep again: {time.monotonic() - started:.1f} s")
    assert again["mlflow_run_id"] == result["mlflow_run_id"]
    assert {row["run_id"] for row in again["rows"]} == {c.info.run_id for c in children}


def test_a_grid_with_an_unknown_key_is_refused_before_any_run(root, capsys):
    from mlflow import MlflowClient

    from cli.main import run

    code = run(["sweep", str(root / "dpo.yaml"), "mlflow_experiment=refused-sweep",
                 "--grid", "learning_rat=1e-4,5e-5", "pref_beta=0.1,0.3"])
    assert code == 2
    err = capsys.readouterr().err
    assert "unknown key 'learning_rat' in the grid; did you mean 'learning_rate'?" in err and "Traceback" not in err
    assert MlflowClient(f"sqlite:///{root / 'mlflow.db'}").get_experiment_by_name("refused-sweep") is None
