"""Prefect artifacts shown on each flow run: summary, evaluation (or predict) table, loss plot (MLflow's artifacts:
tuneline.tracking)."""

from __future__ import annotations

import base64
from pathlib import Path

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from tuneline.config import RunConfig
from tuneline.content.records import BuiltDataset, Evaluation, Prediction
from tuneline.evaluation import not_evaluated
from tuneline.pipeline.record import run_link
from tuneline.pipeline.records import MlflowRun


def _fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _bad_rows(dataset: BuiltDataset) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in sorted(dataset.bad_rows.items())) or "none"


def publish_run_artifacts(config: RunConfig, run: MlflowRun, dataset: BuiltDataset, base_eval: Evaluation,
                          tuned_eval: Evaluation, plots: list[str]) -> None:
    base, tuned = base_eval.metrics, tuned_eval.metrics
    rows = [{"metric": k, "base": _fmt(base.get(k, "")), "tuned": _fmt(tuned.get(k, ""))}
            for k in sorted(set(base) | set(tuned))]
    skipped = not_evaluated(tuned_eval, base_eval)
    if skipped:
        evaluation = f"Not evaluated: {skipped}.\n"
    else:
        create_table_artifact(rows, key="evaluation", description="evaluation before vs after training")
        table = "\n".join(f"| {r['metric']} | {r['base']} | {r['tuned']} |" for r in rows)
        evaluation = f"| metric | base | tuned |\n|---|---|---|\n{table}\n"
    link = run_link(run) or run.run_id
    summary = (
        f"# {config.run_name}\n\n| | |\n|---|---|\n| stage | {config.stage} |\n"
        f"| finetuning | {config.finetuning.finetuning_type} |\n| model | {config.model.model_name_or_path} |\n"
        f"| dataset | {config.data.dataset} (`{dataset.fingerprint[:12]}`, {dataset.train_rows} rows) |\n"
        f"| rows dropped | {_bad_rows(dataset)} |\n"
        f"| rows truncated to cutoff_len {config.data.cutoff_len} | {dataset.truncated_rows} |\n"
        f"| MLflow run | {link} |\n\n## Evaluation\n\n{evaluation}"
    )
    create_markdown_artifact(summary, key="run-summary", description="what ran and how it scored")
    loss = next((p for p in plots if Path(p).name == "training_loss.png"), plots[0] if plots else None)
    if loss and Path(loss).is_file():
        data = base64.b64encode(Path(loss).read_bytes()).decode("ascii")
        create_markdown_artifact(f"![loss curve](data:image/png;base64,{data})\n\n`{loss}`", key="loss-plot",
                                 description="training loss")


def publish_prediction_artifacts(config: RunConfig, run: MlflowRun, dataset: BuiltDataset,
                                 predicted: Prediction) -> None:
    """A `do_predict` run's summary (what answered what, the scores, where the answers are) and its score table."""
    metrics = predicted.metrics
    rows = [{"metric": k, "value": _fmt(v)} for k, v in sorted(metrics.items())]
    if rows:
        create_table_artifact(rows, key="predict", description="scores of the generated answers (LLaMA-Factory's)")
    table = "\n".join(f"| {r['metric']} | {r['value']} |" for r in rows) or "| (no answers) | |"
    link = run_link(run) or run.run_id
    adapters = config.model.adapter_name_or_path or "none"
    summary = (
        f"# {config.run_name}\n\n| | |\n|---|---|\n| model | {config.model.model_name_or_path} |\n"
        f"| adapters | {adapters} |\n"
        f"| eval set | {config.data.eval_dataset or config.data.dataset} (`{dataset.fingerprint[:12]}`, "
        f"{dataset.eval_rows} rows) |\n| answers | {predicted.num_samples}, in "
        f"`{Path(predicted.output_dir) / 'generated_predictions.jsonl'}` |\n| MLflow run | {link} |\n\n"
        f"## Scores\n\n| metric | value |\n|---|---|\n{table}\n"
    )
    create_markdown_artifact(summary, key="run-summary", description="what answered what, and how it scored")
