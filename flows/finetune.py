"""The fine-tuning flow: seven cached steps, one MLflow run per piece of work.

    python -m flows.finetune examples/sft_lora_demo.yaml learning_rate=5e-5   (or: tuneline train ...)

Re-running with the same inputs skips every finished step; a killed run started again resumes `train` from
its last checkpoint in the same MLflow run. A ppo config with `reward_model_config` runs that rm config first,
as a subflow of the same shape (and as cached).
"""

from __future__ import annotations

import sys
from pathlib import Path

from prefect import flow, runtime
from prefect.settings import PREFECT_API_URL

import tasks
from flows.api_server import is_temporary
from flows.artifacts import publish_run_artifacts
from tuneline.config import RunConfig, load_config
from tuneline.pipeline import keys, record
from tuneline.pipeline.steps import reward_model_overrides


def _flow_run_name() -> str:
    params = runtime.flow_run.parameters
    return load_config(params["config_path"], params.get("overrides"), check_paths=False).run_name


def _flow_run_url() -> str | None:
    """The flow run's page in the Prefect UI; none where the API is a temporary server that stops with the run."""
    return None if is_temporary(PREFECT_API_URL.value()) else runtime.flow_run.ui_url


def _with_cache(config: RunConfig, task):
    """Results live under pipeline_cache_dir; `refresh_cache` reruns steps even on a key hit."""
    storage = Path(config.pipeline.pipeline_cache_dir).resolve() / "prefect-results"
    return task.with_options(result_storage=storage, refresh_cache=config.pipeline.refresh_cache or None)


@flow(name="finetune", flow_run_name=_flow_run_name)
def finetune(config_path: str, overrides: list[str] | None = None) -> dict:
    config = load_config(config_path, overrides)
    if config.pipeline.reward_model_config:  # ppo: its reward model is trained (or found cached) first
        reward = finetune(config.pipeline.reward_model_config,
                          ["refresh_cache=true"] if config.pipeline.refresh_cache else [])  # --no-cache: all of it
        overrides = [*(overrides or []), *reward_model_overrides(config.pipeline.reward_model_config,
                                                                 reward["output_dir"])]
        config = load_config(config_path, overrides)
    step = {name: _with_cache(config, getattr(tasks, name)) for name in tasks.__all__}
    run = record.start_run(config, keys.dataset_key(config), runtime.flow_run.id, _flow_run_url())

    tokenizer = step["load_tokenizer"](config)
    dataset = step["build_dataset"](config, tokenizer)
    record.record_dataset(run, dataset)
    reference = step["build_reference_model"](config, dataset)
    trained = step["train"](config, dataset, reference, run)
    base_eval = step["evaluate"].with_options(task_run_name="evaluate base")(config, dataset)
    tuned_eval = step["evaluate"].with_options(task_run_name="evaluate tuned")(config, dataset, trained)
    plots = step["plot"](config, trained, run)
    card = step["model_card"](config, trained, base_eval, tuned_eval, plots, dataset, run)

    version = record.record_results(run, config, base_eval, tuned_eval, dataset["fingerprint"])
    publish_run_artifacts(config, run, dataset, base_eval, tuned_eval, plots)
    return {"output_dir": trained["output_dir"], "mlflow_run_id": run["run_id"], "model_card": card,
            "base": base_eval.get("metrics", {}), "tuned": tuned_eval.get("metrics", {}),
            "registered_version": version}


if __name__ == "__main__":  # the same as `tuneline train CONFIG [key=value ...]`
    from flows.cli import run

    run(["train", *sys.argv[1:]])
