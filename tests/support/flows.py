"""The flow tests' shared steps: run the finetune flow in this process and read back what the Prefect API recorded
of it (task states, artifacts); a small sft config for flows started as processes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


STEPS = {"load-tokenizer", "build-dataset", "build-reference-model", "train", "evaluate", "plot", "model-card"}


def run_flow(config_path, overrides=None, settings=None):
    from flows.finetune import finetune

    state = finetune(str(config_path), settings=settings, overrides=overrides or [], return_state=True)
    assert state.is_completed(), state.message
    result = dict(state.result(), flow_run_id=state.state_details.flow_run_id)
    return result, task_states(state.state_details.flow_run_id, last="model-card")  # a completed flow's last step


def task_states(flow_run_id, last: str | None = None) -> dict[str, list[str]]:
    """{task name: [state names]} of one flow run, read back from the Prefect API.

    The server records task runs and their states from events, a moment after the flow returns: read until each
    run's state is final (a fast cached step was once read back as 'Running', its final state not yet recorded) and,
    given `last`, until that step's run is recorded at all (under load it once was not yet).
    """
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            return await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))

    deadline = time.monotonic() + 30
    runs = asyncio.run(read())
    def recorded(runs) -> bool:
        final = all(run.state is not None and run.state.is_final() for run in runs)
        return final and (last is None or any(run.name.split(" ")[0] == last for run in runs))

    while not recorded(runs) and time.monotonic() < deadline:
        time.sleep(0.2)
        runs = asyncio.run(read())
    out: dict[str, list[str]] = {}
    for run in runs:
        out.setdefault(run.name.split(" ")[0], []).append(run.state.name if run.state else "no state recorded")
    return out


def flow_artifacts(flow_run_id) -> dict[str, object]:
    """{key: data} of a flow run's Prefect artifacts."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            found = await client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        return {a.key: a.data for a in found}

    return asyncio.run(read())


def tiny_config(root: Path, model_dir: Path, **changes) -> Path:
    values = {
        "model_name_or_path": str(model_dir), "stage": "sft", "finetuning_type": "lora", "lora_rank": 4,
        "dataset": "demo_sft", "eval_dataset": "demo_sft_eval", "dataset_dir": str(REPO / "data"),
        "template": "chatml", "cutoff_len": 64, "max_samples": 64, "output_dir": str(root / "out"), "max_steps": 4,
        "logging_steps": 2, "per_device_train_batch_size": 8, "pipeline_cache_dir": str(root / "cache"),
        "mlflow_tracking_uri": f"sqlite:///{root / 'mlflow.db'}", "mlflow_experiment": "served",
        "eval_max_samples": 4, "eval_max_new_tokens": 2, **changes,
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(values))
    return path
