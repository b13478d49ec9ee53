"""The fine-tuning flow: seven cached steps, one MLflow run per piece of work.

    python -m flows.finetune examples/sft_lora_demo.yaml learning_rate=5e-5   (the same as: tuneline train ...)

Re-running with the same inputs skips every finished step; a killed run started again resumes `train` from
its last checkpoint in the same MLflow run. A ppo config with `reward_model_config` runs that rm config first,
as a subflow of the same shape (and as cached). The command line, a served deployment and a worker all run this
same function. A `do_predict` config without `do_train` runs `predict_flow` instead (load-tokenizer ->
build-dataset -> predict: LLaMA-Factory's batch prediction, cached like evaluate); `tuneline predict` runs it by name.
"""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path

from prefect import flow, runtime
from prefect.settings import PREFECT_API_URL

from orchestration.crash_detection import ensure_crash_detection
from orchestration.parameters import Settings, all_overrides
from orchestration.prefect_artifacts import publish_prediction_artifacts, publish_run_artifacts
from orchestration.server_lost import exit_now, is_server_lost, quiet_while_server_lost, server_lost_message
from orchestration.user_errors import show_user_errors_without_traceback
from tasks import build_dataset, build_reference_model, evaluate, load_tokenizer, model_card, plot, predict, train
from tuneline.config import RunConfig, load_config
from tuneline.content.records import BuiltDataset, Evaluation, Prediction, ReferenceLogps, TokenizerInfo
from tuneline.errors import UserError, report_user_errors
from tuneline.identity import keys
from tuneline.pipeline import record
from tuneline.pipeline.preflight import checked_config
from tuneline.pipeline.records import TrainResult
from tuneline.pipeline.reward_model_run import reward_model_overrides

show_user_errors_without_traceback()
quiet_while_server_lost()


def _flow_run_name() -> str:
    params = runtime.flow_run.parameters
    settings = params.get("settings")
    if isinstance(settings, dict):
        settings = Settings(**settings)
    try:  # the config the flow reads next (one read: checked_config keeps it)
        return checked_config(params["config_path"], all_overrides(settings, params.get("overrides"))).run_name
    except UserError:  # the flow itself reports it, named by its file
        return Path(str(params["config_path"])).stem


def _flow_run_url() -> str | None:
    """The flow run's page in the Prefect UI; none on Prefect's temporary server, which stops with the run."""
    return runtime.flow_run.ui_url if PREFECT_API_URL.value() else None


def _cache_options(config: RunConfig) -> dict:
    """Results live under pipeline_cache_dir; `refresh_cache` reruns steps even on a key hit."""
    storage = Path(config.pipeline.pipeline_cache_dir).resolve() / "prefect-results"
    return {"result_storage": storage, "refresh_cache": config.pipeline.refresh_cache or None}


@flow(name="finetune", flow_run_name=_flow_run_name)
def finetune(config_path: str, settings: Settings | None = None, overrides: list[str] | None = None,
             mlflow_parent_run_id: str | None = None) -> dict:
    # mlflow_parent_run_id: a sweep's MLflow run, which this run's is nested under (a tag, part of no key)
    overrides = all_overrides(settings, overrides)
    config = checked_config(config_path, overrides)
    if PREFECT_API_URL.value():  # a lasting server: it marks this run Crashed if its process dies
        ensure_crash_detection()
    if config.predict_only:  # LLaMA-Factory's `do_predict` without `do_train`: nothing to train
        return predict_flow(config_path, overrides=overrides)
    if config.pipeline.reward_model_config:  # ppo: its reward model is trained (or found cached) first
        reward = finetune(config.pipeline.reward_model_config,
                          overrides=["refresh_cache=true"] if config.pipeline.refresh_cache else [])  # --no-cache: all
        overrides = [*overrides, *reward_model_overrides(config.pipeline.reward_model_config,
                                                                 reward["output_dir"], config)]
        config = load_config(config_path, overrides)
    cache = _cache_options(config)
    run = record.start_run(config, keys.dataset_key(config), runtime.flow_run.id, _flow_run_url(),
                           parent_run_id=mlflow_parent_run_id)

    # each step's record (`from_stored`: also the plain dict an earlier tuneline left in Prefect's result store)
    tokenizer = TokenizerInfo.from_stored(load_tokenizer.with_options(**cache)(config))
    dataset = BuiltDataset.from_stored(build_dataset.with_options(**cache)(config, tokenizer))
    record.record_dataset(run, config, dataset)
    reference = ReferenceLogps.from_stored(build_reference_model.with_options(**cache)(config, dataset))
    trained = TrainResult.from_stored(train.with_options(**cache)(config, dataset, reference, run))
    base_eval = Evaluation.from_stored(evaluate.with_options(task_run_name="evaluate base", **cache)(config, dataset))
    tuned_eval = Evaluation.from_stored(
        evaluate.with_options(task_run_name="evaluate tuned", **cache)(config, dataset, trained))
    plots = plot.with_options(**cache)(config, trained, run)
    card = model_card.with_options(**cache)(config, trained, base_eval, tuned_eval, plots, dataset, run)

    version = record.record_results(run, config, base_eval, tuned_eval, dataset.fingerprint)
    publish_run_artifacts(config, run, dataset, base_eval, tuned_eval, plots)
    return {"output_dir": trained.output_dir, "mlflow_run_id": run.run_id, "model_card": card,
            "base": base_eval.metrics, "tuned": tuned_eval.metrics, "registered_version": version}


@flow(name="predict", flow_run_name=_flow_run_name)
def predict_flow(config_path: str, settings: Settings | None = None, overrides: list[str] | None = None) -> dict:
    """`do_predict`: the model the config names (base, `adapter_name_or_path`) answers the eval set, cached."""
    config = checked_config(config_path, all_overrides(settings, overrides))
    cache = _cache_options(config)
    run = record.start_run(config, keys.dataset_key(config), runtime.flow_run.id, _flow_run_url())

    tokenizer = TokenizerInfo.from_stored(load_tokenizer.with_options(**cache)(config))
    dataset = BuiltDataset.from_stored(build_dataset.with_options(**cache)(config, tokenizer))
    record.record_dataset(run, config, dataset)
    predicted = Prediction.from_stored(predict.with_options(**cache)(config, dataset))

    record.record_predictions(run, predicted)
    publish_prediction_artifacts(config, run, dataset, predicted)
    return {"output_dir": predicted.output_dir, "mlflow_run_id": run.run_id, "predict": predicted.metrics,
            "num_samples": predicted.num_samples, "cache_hit": predicted.cache_hit}


def main(args) -> int:
    """`tuneline train` and `python -m flows.finetune`: check the config before Prefect starts a run, run the flow,
    print its result. `args`: config, overrides and no_cache (`--no-cache`: every step runs again)."""
    overrides = [*args.overrides, *(["refresh_cache=true"] if args.no_cache else [])]
    flow_to_run = predict_flow if checked_config(args.config, overrides).predict_only else finetune
    try:
        result = flow_to_run(args.config, overrides=overrides)
    except Exception as error:
        if not any(is_server_lost(e) for e in _causes(error)):
            raise
        print(f"error: {server_lost_message()}", file=sys.stderr)
        exit_now(1)
    print(json.dumps(result, indent=2, default=str))
    return 0


def predict_main(args) -> int:
    """`tuneline predict CONFIG`: the config's model answers its eval set, trains nothing (do_predict, no do_train)."""
    args.overrides = [*args.overrides, *PREDICT_OVERRIDES]
    return main(args)


# What `tuneline predict` sets: LLaMA-Factory's nlg_eval keys; the model is the config's (a finished training's
# output is named in adapter_name_or_path or model_name_or_path, as in LLaMA-Factory).
PREDICT_OVERRIDES = ["do_predict=true", "predict_with_generate=true", "do_train=false"]


def _causes(error: BaseException | None):
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print("usage: python -m flows.finetune CONFIG [key=value ...]", file=sys.stderr)
        sys.exit(2)
    with report_user_errors() as reported:
        sys.exit(main(Namespace(config=sys.argv[1], overrides=sys.argv[2:], no_cache=False)))
    sys.exit(reported.exit_code)
