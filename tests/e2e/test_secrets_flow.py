"""Secrets planted in a run's config and environment appear nowhere the run leaves a record: not in any file under
the run's folders (MLflow's store and artifacts, output_dir, the caches, Prefect's stored results), not in an
MLflow param or tag, not in the Prefect logs or parameters of the flow run. A real Prefect API and MLflow store."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import yaml

from tests.support.flows import REPO, run_flow

PLANTED = {  # where each value is planted -> a value unique enough to grep for
    "hf_hub_token": "hf_planted_config_token_7f3a",
    "MLFLOW_TRACKING_PASSWORD": "planted-mlflow-password-91c2",
    "MLFLOW_TRACKING_TOKEN": "planted-mlflow-token-5d0e",
    "HF_TOKEN": "hf_planted_env_token_b84d",
}
ENV_KEYS = ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "HF_TOKEN")


def flow_run_record(flow_run_id) -> tuple[list[str], dict]:
    """Every log message of the flow run and its tasks, and the flow run's parameters, from the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()

    async def read():
        async with get_client() as client:
            messages: list[str] = []
            while page := await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                                                 limit=200, offset=len(messages)):
                messages += [log.message for log in page]
            return messages, (await client.read_flow_run(flow_run_id)).parameters

    return asyncio.run(read())


def test_planted_secrets_reach_no_file_param_tag_or_log_of_the_run(prefect_api, tmp_path, tiny_model_dir,
                                                                   monkeypatch):
    from mlflow import MlflowClient

    shutil.copytree(REPO / "data", tmp_path / "data")
    config = tmp_path / "sft.yaml"
    config.write_text(yaml.safe_dump({
        "model_name_or_path": str(tiny_model_dir), "stage": "sft", "finetuning_type": "lora", "lora_rank": 4,
        "dataset": "demo_sft", "eval_dataset": "demo_sft_eval", "dataset_dir": str(tmp_path / "data"),
        "template": "chatml", "cutoff_len": 64, "max_samples": 32, "output_dir": str(tmp_path / "out"),
        "max_steps": 2, "logging_steps": 1, "per_device_train_batch_size": 8, "eval_max_samples": 4,
        "eval_max_new_tokens": 2, "pipeline_cache_dir": str(tmp_path / "cache"),
        "mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "mlflow_experiment": "secrets",
        "hf_hub_token": PLANTED["hf_hub_token"],
    }))
    for key in ENV_KEYS:  # MLflow and huggingface_hub read these; a SQLite store and a local model ignore them
        monkeypatch.setenv(key, PLANTED[key])
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "planted-user")

    result, states = run_flow(config)
    assert states["train"] == ["Completed"] and states["model-card"] == ["Completed"], states

    files = [p for p in tmp_path.rglob("*") if p.is_file() and p != config]
    files += [p for p in Path(os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"]).rglob("*") if p.is_file()]
    assert any(p.name == "README.md" for p in files) and any(p.suffix == ".db" for p in files), "a run to search"
    run = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(result["mlflow_run_id"])
    assert run.data.params["hf_hub_token"] == "***" and run.data.params["mlflow_tracking_uri"].startswith("sqlite")
    logs, parameters = flow_run_record(result["flow_run_id"])
    assert any("'loss'" in line for line in logs), "the training child's lines are among the logs searched"
    records = {"MLflow params and tags": repr((run.data.params, run.data.tags)), "Prefect logs": "\n".join(logs),
               "flow run parameters": repr(parameters)}
    for where, secret in PLANTED.items():
        assert not [str(p) for p in files if secret.encode() in p.read_bytes()], f"{where}'s value is in a file"
        assert not [name for name, text in records.items() if secret in text], f"{where}'s value is recorded"
