"""Retraining that decides for itself: train only on new data, promote only a better model.

    tuneline retrain CONFIG REGISTERED_MODEL [key=value ...] [--force] [--metric eval_loss] [--min-delta 0]

The data and base model are fingerprinted; equal to those of the registered model's `champion`, there is nothing
to learn and the run ends there. Otherwise the finetune flow runs as a subflow (every cache and resume applies),
the champion is scored on the same held-out set (cached), and the MLflow alias `champion` moves to the new version
only if `promotion_metric` beats it by `promotion_min_delta`; else the new version is the `challenger`, with the
reason. Each decision is a Prefect artifact and a tag on the version. Promotions of one model take turns.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.finetune import finetune
from orchestration.concurrency import one_at_a_time
from orchestration.parameters import Settings, all_overrides
from tasks import build_dataset, evaluate, load_tokenizer
from tuneline import tracking
from tuneline.config import RunConfig
from tuneline.content.fingerprint import fingerprint
from tuneline.content.records import BuiltDataset, Evaluation, TokenizerInfo
from tuneline.errors import ConfigError
from tuneline.evaluation.metric_names import metric_problems
from tuneline.pipeline import promotion, record
from tuneline.pipeline.preflight import checked_config
from tuneline.pipeline.records import TrainResult


def checked_retrain_config(config_path: str, registered_model: str, overrides: list[str],
                           min_delta: float = 0.0, promotion_metric: str = "eval_loss") -> RunConfig:
    """The config as the retrain trains it; refused before anything starts when it cannot be compared."""
    if min_delta < 0:
        raise ConfigError(f"'promotion_min_delta' is {min_delta}; allowed: 0 or more")
    config = checked_config(config_path, [*overrides, f"mlflow_registered_model={registered_model}"])
    if not config.has_validation:
        raise ConfigError("retraining compares the new model with the champion on a held-out set: set 'val_size' "
                          "(e.g. 0.1) or 'eval_dataset'")
    problems = metric_problems(config, promotion_metric, flag="promotion metric", train_metrics=False)
    if problems:
        raise ConfigError(problems)
    return config


def _champion_score(config: RunConfig, champion: dict, metric: str, uri: str) -> float | None:
    """The champion scored on this run's validation split, through the cached evaluate step."""
    name, version = config.pipeline.mlflow_registered_model, champion["version"]
    folder = Path(config.pipeline.pipeline_cache_dir) / "registry" / name / version
    model_dir = tracking.download_version(uri, name, version, folder)
    cache = {"result_storage": Path(config.pipeline.pipeline_cache_dir).resolve() / "prefect-results"}
    tokenizer = TokenizerInfo.from_stored(load_tokenizer.with_options(**cache)(config))
    dataset = BuiltDataset.from_stored(build_dataset.with_options(**cache)(config, tokenizer))
    trained = TrainResult(str(model_dir), fingerprint("registered", name, version, champion["run_id"]))
    scored = evaluate.with_options(task_run_name=f"evaluate champion v{version}", **cache)(config, dataset, trained)
    return Evaluation.from_stored(scored).metrics.get(metric)


def promote(uri: str, name: str, new: str, champion: dict | None,
            decision: promotion.Decision) -> tuple[str, promotion.Decision]:
    """Set the alias the decision gives `new`, one retrain of `name` at a time: a champion that changed since this
    retrain compared against it is not replaced (two retrains never both promote)."""
    with one_at_a_time(f"promote-{name}"):
        now = tracking.alias_version(uri, name, promotion.CHAMPION)
        if (now and now["version"]) != (champion and champion["version"]):
            decision = promotion.Decision(False, f"the champion became version {now['version']} during this "
                                                 "retrain; retrain again to compare against it")
        alias = promotion.CHAMPION if decision.promote else promotion.CHALLENGER
        tracking.set_alias(uri, name, alias, new)
    return alias, decision


def _record(name: str, text: str) -> None:
    create_markdown_artifact(f"# Retrain of `{name}`\n\n{text}\n", key="retrain-decision",
                             description="what this retrain decided and why")


@flow(name="retrain")
def retrain(config_path: str, registered_model: str, promotion_metric: str = "eval_loss",
            greater_is_better: bool = False, promotion_min_delta: float = 0.0, force: bool = False,
            settings: Settings | None = None, overrides: list[str] | None = None) -> dict:
    overrides = [*all_overrides(settings, overrides), f"mlflow_registered_model={registered_model}"]
    config = checked_retrain_config(config_path, registered_model, overrides, promotion_min_delta,
                                    promotion_metric)
    uri = record.connect_tracking(config)
    identity = promotion.data_identity(config)
    champion = tracking.alias_version(uri, registered_model, promotion.CHAMPION)
    if champion and promotion.unchanged(champion, identity) and not force:
        text = f"data unchanged since version {champion['version']}: nothing trained"
        tracking.tag_version(uri, registered_model, champion["version"], {"tuneline.last_retrain_check": text})
        _record(registered_model, text)
        return {"decision": "unchanged", "champion": champion["version"], "reason": text}

    result = finetune(config_path, overrides=overrides)
    new = result["registered_version"]
    if champion and new == champion["version"]:
        text = f"version {new} is already the champion (its training was a cache hit)"
        _record(registered_model, text)
        return {"decision": "unchanged", "champion": new, "reason": text}
    new_score = result["tuned"].get(promotion_metric)
    champion_score = _champion_score(config, champion, promotion_metric, uri) if champion else None
    decision = promotion.decide(promotion_metric, new_score, champion_score, greater_is_better, promotion_min_delta)

    alias, decision = promote(uri, registered_model, new, champion, decision)
    verdict = f"{'promoted' if decision.promote else 'not promoted'}: {decision.reason}"
    tracking.tag_version(uri, registered_model, new, {promotion.DECISION_TAG: verdict})
    _record(registered_model, f"version {new} is the **{alias}**: {decision.reason}")
    return {"decision": alias, "version": new, "champion": new if decision.promote else champion["version"],
            "reason": decision.reason, "new_score": new_score, "champion_score": champion_score}

