"""The plot and model-card steps' library side: the loss curves and the run's README.md from the step references."""

from __future__ import annotations

from pathlib import Path

from tuneline.config import RunConfig
from tuneline.content.records import BuiltDataset, Evaluation
from tuneline.pipeline.records import MlflowRun, TrainResult


def make_plots(config: RunConfig, trained: TrainResult) -> list[str]:
    from tuneline.report import plot_curves

    output_dir = trained.path
    return plot_curves(output_dir / "trainer_log.jsonl", output_dir)


def make_model_card(config: RunConfig, trained: TrainResult, base_eval: Evaluation, tuned_eval: Evaluation,
                    plots: list[str], dataset: BuiltDataset, run: MlflowRun) -> str:
    from tuneline.evaluation import not_evaluated
    from tuneline.pipeline.record import run_link
    from tuneline.report import write_model_card
    from tuneline.report.image_answers import image_answer_rows, image_answers_section, write_image_answers

    rows = image_answer_rows(_answers(base_eval), _answers(tuned_eval))
    gallery = write_image_answers(rows, trained.output_dir)
    return write_model_card(
        config, trained.output_dir,
        base_metrics=base_eval.metrics, tuned_metrics=tuned_eval.metrics,
        not_evaluated=not_evaluated(tuned_eval, base_eval),
        dataset_fingerprints={name: dataset.fingerprint for name in config.dataset_names},
        plots=plots, mlflow_run=run_link(run), image_answers=image_answers_section(gallery),
    )


def _answers(evaluation: Evaluation) -> list[dict]:
    """The generated answers an evaluate-step result stored (none for a skipped or text-scored one)."""
    import json

    from tuneline.evaluation import EVAL_PREDICTIONS

    path = Path(evaluation.path) / EVAL_PREDICTIONS if evaluation.path else None
    if path is None or not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
