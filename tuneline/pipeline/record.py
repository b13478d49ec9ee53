"""The MLflow record of one piece of work, from the orchestrator's side (all calls via tuneline.tracking).

A flow-run id changes on every start, so the MLflow run is keyed by the training itself (`keys.run_key`): every
restart that resumes the same training reopens the same run."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path

from tuneline import tracking
from tuneline.config import RunConfig
from tuneline.config.args import ADAPTER_TYPES
from tuneline.content.records import BuiltDataset, Evaluation, Prediction
from tuneline.evaluation import EVAL_METRICS, EVAL_PREDICTIONS, PREDICT_RESULTS, not_evaluated
from tuneline.identity import keys
from tuneline.pipeline.records import MlflowRun, TrainResult
from tuneline.runtime.contract import METRICS_SPOOL_DIR, PREDICTIONS_FILE

log = logging.getLogger(__name__)

PACKAGES = ("tuneline", "torch", "transformers", "peft", "accelerate", "datasets", "prefect", "mlflow")
SERVING_PACKAGES = ("tuneline", "torch", "transformers", "peft", "accelerate", "mlflow")
REGISTERED_TAG = "tuneline.registered_version"
EVALUATION_TAG = "tuneline.evaluation"  # "done", or "skipped: <why>"
PARENT_RUN_TAG = "mlflow.parentRunId"  # MLflow's own: the UI nests the run under its parent
TRUST_REMOTE_CODE_TAG = "tuneline.trust_remote_code"  # set only when on: the model repo's Python code ran
NOT_MODEL_FILES = {"run.json", "trainer_log.jsonl", "tuneline_config.yaml"}


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def git_commit() -> str | None:
    try:
        found = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                               cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found.stdout.strip() or None


def source_tags(commit: str | None) -> dict[str, str]:
    """MLflow's own source tags, which fill the UI's User, Source and Version columns (tuneline's commit)."""
    import getpass

    tags = {"mlflow.source.type": "JOB", "mlflow.source.name": "tuneline finetune flow"}
    try:
        tags["mlflow.user"] = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (containers)
        pass
    if commit:
        tags["mlflow.source.git.commit"] = commit
    return tags


def connect_tracking(config: RunConfig) -> str:
    """Fail now if the MLflow store is unreachable, else open it; returns the resolved tracking URI."""
    uri = tracking.resolve_tracking_uri(config.pipeline.mlflow_tracking_uri)
    tracking.check_tracking_available(uri)
    tracking.open_stores(uri)
    return uri


def start_run(config: RunConfig, dataset_fp: str, flow_run_id: str | None, flow_run_url: str | None,
              parent_run_id: str | None = None) -> MlflowRun:
    """Open (or reopen) the MLflow run of this work; fail before any training if the store is unreachable.
    `parent_run_id` (a sweep's run) is a tag, never part of the key."""
    uri = connect_tracking(config)
    run_key = keys.run_key(config, dataset_fp)
    work_key = keys.work_key(config, run_key)
    commit = git_commit()
    tags = {
        "tuneline.stage": config.stage,
        "tuneline.finetuning_type": config.finetuning.finetuning_type,
        "tuneline.base_model": str(config.model.model_name_or_path),
        "tuneline.dataset": str(config.data.dataset or config.data.eval_dataset),
        "tuneline.dataset_fingerprint": dataset_fp,
        "tuneline.git_commit": commit or "unknown",
        **source_tags(commit),
        **{f"version.{k}": v for k, v in package_versions().items()},
        **({PARENT_RUN_TAG: parent_run_id} if parent_run_id else {}),
        **({TRUST_REMOTE_CODE_TAG: "true"} if config.model.trust_remote_code else {}),  # the model's own code ran
    }
    run_id = tracking.open_run(uri, config.experiment_name, run_key, config.run_name, tags,
                               reopen_finished=True, work_key=work_key, fresh=config.pipeline.refresh_cache)
    if flow_run_id:
        tracking.tag_flow_run(run_id, flow_run_id, flow_run_url, tracking_uri=uri)
    if changed := tracking.log_params(run_id, config.masked(), tracking_uri=uri):
        shown = ", ".join(f"{k}={v}" for k, v in changed.items())
        log.warning("MLflow run %s continues with other settings: %s (its params keep the first values; the tags "
                    "tuneline.resumed_with.<key> hold these)", run_id, shown)
    return MlflowRun(run_id=run_id, tracking_uri=uri, url=tracking.run_url(uri, run_id),
                     ui_command=tracking.ui_command(uri), run_key=run_key, work_key=work_key)


def run_link(run: MlflowRun) -> str | None:
    """Markdown for the run's page in the MLflow UI (model card, Prefect summary); a local store's link works once
    its UI is served, so the command comes with it."""
    if not run.url:
        return None
    link = f"[{run.run_id}]({run.url})"
    return f"{link} (a local store: serve its UI with `{run.ui_command}`)" if run.ui_command else link


def final_model_files(output_dir: Path, into: Path, *, link: bool = False) -> Path:
    """Copy the final adapter/model (top-level files, no checkpoints or bookkeeping) into a folder to log; with
    `link`, symbolic links instead, for a reader that copies them anyway (no second copy of the weights)."""
    into.mkdir(parents=True, exist_ok=True)
    for path in output_dir.iterdir():
        if not path.is_file() or path.name in NOT_MODEL_FILES or path.name.startswith("."):
            continue
        if link:
            (into / path.name).symlink_to(path.resolve())
        else:
            shutil.copy2(path, into / path.name)
    return into


def record_training(run: MlflowRun, config: RunConfig, trained: TrainResult) -> None:
    """The training's files and model in the run; step metrics the child could not send (MLflow was unreachable
    while it trained) are sent now, or stay in its spool for the next start."""
    uri, run_id, output_dir = run.tracking_uri, run.run_id, trained.path
    tracking.flush_spool(run_id, uri, output_dir / METRICS_SPOOL_DIR)
    for name in ("tuneline_config.yaml", "trainer_log.jsonl", PREDICTIONS_FILE):
        if (output_dir / name).is_file():
            tracking.log_artifacts(run_id, output_dir / name, tracking_uri=uri)
    if (output_dir / PREDICT_RESULTS).is_file():  # `predict_with_generate`: the child's scores of its answers
        _log_fresh_metrics(run, json.loads((output_dir / PREDICT_RESULTS).read_text(encoding="utf-8")))
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = final_model_files(output_dir, Path(tmp) / "trained", link=True)  # the MLflow model copies
        tracking.log_and_register_model(run_id, model_dir, None, {}, loading_recipe(config), serving_config(config),
                                        serving_requirements(), tracking_uri=uri)


def serving_config(config: RunConfig) -> dict:
    """The run's config as the logged model's `model_config`. Secrets are left out; local model paths are made
    absolute, so the base of an adapter is found from any folder on this machine."""
    from tuneline.config.run_config import split_names
    from tuneline.config.secrets import is_secret

    values = {key: value for key, value in config.flat().items() if not (value and is_secret(key))}
    for key in ("model_name_or_path", "adapter_name_or_path"):
        names = split_names(values.get(key))
        if names:
            values[key] = ",".join(str(Path(n).resolve()) if Path(n).exists() else n for n in names)
    return values


def serving_requirements() -> list[str]:
    """What loading the logged model imports, pinned to this run's versions (tuneline brings the rest)."""
    versions = package_versions()
    return [f"{name}=={versions[name]}" for name in SERVING_PACKAGES if name in versions]


def logged_model(config: RunConfig, into: Path) -> tuple[str, Path] | None:
    """The final model the finished MLflow run of exactly this config's work logged, downloaded into `into`, with
    the run id; None when the store holds no such run (the lookup never creates a store or an experiment)."""
    uri = tracking.resolve_tracking_uri(config.pipeline.mlflow_tracking_uri)
    work_key = keys.work_key(config, keys.run_key(config, keys.dataset_key(config)))
    run_id = tracking.finished_run_with_key(uri, config.experiment_name, work_key)
    if run_id is None:
        return None
    model = tracking.download_logged_model(run_id, into, tracking_uri=uri)
    return (run_id, model) if model is not None else None


def dataset_facts(dataset: BuiltDataset) -> dict[str, float]:
    """Row, token, truncated-row and dropped-row counts of the built dataset, as numbers runs can be compared
    on."""
    facts = {"data_train_rows": dataset.train_rows, "data_eval_rows": dataset.eval_rows,
             "data_truncated_rows": dataset.truncated_rows, "data_tokens": dataset.tokens}
    facts.update({f"data_bad_rows_{reason.replace(' ', '_')}": count for reason, count in dataset.bad_rows.items()})
    return {k: float(v) for k, v in facts.items() if isinstance(v, (int, float))}


def record_dataset(run: MlflowRun, config: RunConfig, dataset: BuiltDataset) -> None:
    """The built dataset's facts as metrics, and the data as the run's MLflow dataset input, once per run."""
    uri, run_id = run.tracking_uri, run.run_id
    facts = dataset_facts(dataset)
    fresh = {k: v for k, v in facts.items() if k not in tracking.get_run_metrics(uri, run_id)}
    if fresh:
        tracking.log_metrics(run_id, fresh, step=0, tracking_uri=uri)
        data = config.data
        source = {"dataset_dir": str(Path(data.dataset_dir).resolve()), "dataset": data.dataset,
                  "eval_dataset": data.eval_dataset}
        context = "evaluation" if config.predict_only else "training"
        tracking.log_dataset_input(run_id, data.dataset or data.eval_dataset, dataset.fingerprint[:16], source,
                                   facts, context, tracking_uri=uri)


def _log_fresh_metrics(run: MlflowRun, metrics: dict) -> dict[str, float]:
    """Log the numeric metrics the run does not hold yet (a cached rerun logs nothing); returns those logged."""
    logged = tracking.get_run_metrics(run.tracking_uri, run.run_id)
    fresh = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and k not in logged}
    if fresh:
        tracking.log_metrics(run.run_id, fresh, tracking_uri=run.tracking_uri)
    return fresh


def record_predictions(run: MlflowRun, predicted: Prediction) -> None:
    """A prediction's answers (generated_predictions.jsonl) and scores (predict_results.json and metrics), once per
    run; then the run is finished."""
    uri, run_id, folder = run.tracking_uri, run.run_id, Path(predicted.path)
    if not set(predicted.metrics) <= set(tracking.get_run_metrics(uri, run_id)):  # the answers first
        for name in (PREDICTIONS_FILE, PREDICT_RESULTS):
            tracking.log_artifacts(run_id, folder / name, tracking_uri=uri)
        _log_fresh_metrics(run, predicted.metrics)
    tracking.finish_run(run_id, "FINISHED", tracking_uri=uri)


def record_plots(run: MlflowRun, paths: list[str]) -> None:
    for path in paths:
        tracking.log_artifacts(run.run_id, path, "plots", tracking_uri=run.tracking_uri)


def record_model_card(run: MlflowRun, path: str) -> None:
    """The card, and the held-out images it shows beside it (their links are relative), in the run."""
    from tuneline.report.image_answers import GALLERY_DIR

    tracking.log_artifacts(run.run_id, path, tracking_uri=run.tracking_uri)
    gallery = Path(path).parent / GALLERY_DIR
    if gallery.is_dir():
        tracking.log_artifacts(run.run_id, gallery, GALLERY_DIR, tracking_uri=run.tracking_uri)


def record_evaluations(run: MlflowRun, evaluations: dict[str, Evaluation]) -> None:
    """Each evaluation's metrics and answers under `evaluation/<name>/` in the run, the answers as LLaMA-Factory writes
    them (generated_predictions.jsonl), so runs' answers can be read side by side in MLflow."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, evaluation in evaluations.items():
            if not evaluation.path:
                continue
            source, folder = Path(evaluation.path), Path(tmp) / name
            folder.mkdir()
            for stored, logged in ((EVAL_METRICS, EVAL_METRICS), (EVAL_PREDICTIONS, PREDICTIONS_FILE)):
                if (source / stored).is_file():
                    shutil.copyfile(source / stored, folder / logged)
            if any(folder.iterdir()):
                tracking.log_artifacts(run.run_id, folder, f"evaluation/{name}", tracking_uri=run.tracking_uri)


def record_results(run: MlflowRun, config: RunConfig, base_eval: Evaluation, tuned_eval: Evaluation,
                   dataset_fp: str) -> str | None:
    """Before/after metrics once per run, then the registered model version (if configured); finish the run."""
    uri, run_id = run.tracking_uri, run.run_id
    logged = tracking.get_run_metrics(uri, run_id)
    summary = {f"base_{k}": v for k, v in base_eval.metrics.items()}
    summary.update({f"final_{k}": v for k, v in tuned_eval.metrics.items()})
    fresh = {k: float(v) for k, v in summary.items() if isinstance(v, (int, float)) and k not in logged}
    if fresh:  # the answers first: a run that has the metrics has them (a cached rerun uploads nothing)
        record_evaluations(run, {"base": base_eval, "tuned": tuned_eval})
        tracking.log_metrics(run_id, fresh, tracking_uri=uri)
    skipped = not_evaluated(tuned_eval, base_eval)
    tracking.add_tags(run_id, {EVALUATION_TAG: f"skipped: {skipped}" if skipped else "done"}, tracking_uri=uri)
    version = tracking.get_run_tags(uri, run_id).get(REGISTERED_TAG)
    if config.pipeline.mlflow_registered_model and version is None:  # a cached rerun registers nothing new
        tags = {"dataset_fingerprint": dataset_fp, "base_model_key": keys.base_model_key(config),
                "tuneline.base_model": serving_config(config)["model_name_or_path"],
                **{k: str(v) for k, v in summary.items()}}
        version = tracking.register_model(run_id, config.pipeline.mlflow_registered_model, tags, tracking_uri=uri)
        tracking.add_tags(run_id, {REGISTERED_TAG: version}, tracking_uri=uri)
    tracking.finish_run(run_id, "FINISHED", tracking_uri=uri)
    return version


def loading_recipe(config: RunConfig) -> str:
    base = config.model.model_name_or_path
    if config.finetuning.finetuning_type in ADAPTER_TYPES:
        return (f"from peft import AutoPeftModelForCausalLM\n"
                f"model = AutoPeftModelForCausalLM.from_pretrained('<that folder>')  # base: {base}\n")
    return ("from transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('<that folder>')\n")
