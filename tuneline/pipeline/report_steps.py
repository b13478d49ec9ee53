"""The plot and model-card steps' library side: the loss curves and the run's README.md from the step references."""

from __future__ import annotations

from pathlib import Path

from tuneline.config import RunConfig


def make_plots(config: RunConfig, trained: dict) -> list[str]:
    from tuneline.report import plot_curves

    output_dir = Path(trained["output_dir"])
    return plot_curves(output_dir / "trainer_log.jsonl", output_dir)


def make_model_card(config: RunConfig, trained: dict, base_eval: dict, tuned_eval: dict, plots: list[str],
                    dataset: dict, run: dict) -> str:
    from tuneline.evaluation import not_evaluated
    from tuneline.pipeline.record import run_link
    from tuneline.report import write_model_card

    return write_model_card(
        config, trained["output_dir"],
        base_metrics=base_eval.get("metrics", {}), tuned_metrics=tuned_eval.get("metrics", {}),
        not_evaluated=not_evaluated(tuned_eval, base_eval),
        dataset_fingerprints={name: dataset["fingerprint"] for name in config.dataset_names},
        plots=plots, mlflow_run=run_link(run),
    )
