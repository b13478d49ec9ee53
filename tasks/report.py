from prefect import get_run_logger, task

from tasks.caching import content_key
from tuneline.config import RunConfig
from tuneline.content.records import BuiltDataset, Evaluation
from tuneline.identity import keys
from tuneline.pipeline.publishing import publish_model
from tuneline.pipeline.record import record_model_card, record_plots
from tuneline.pipeline.records import MlflowRun, TrainResult
from tuneline.pipeline.report_steps import make_model_card, make_plots


@task(name="plot", persist_result=True, task_run_name="plot {config.finetuning.stage}",
      cache_key_fn=content_key(lambda config, trained, run: keys.plot_key(trained.train_key)))
def plot(config: RunConfig, trained: TrainResult, run: MlflowRun) -> list[str]:
    """Loss and metric curves from trainer_log.jsonl, as PNGs in output_dir and MLflow."""
    paths = make_plots(config, trained)
    record_plots(run, paths)
    return paths


def _card_key(config, trained, base_eval, tuned_eval, plots, dataset, run) -> str:
    return keys.model_card_key(config, trained.train_key, base_eval.fingerprint, tuned_eval.fingerprint, run.run_id)


@task(name="model-card", persist_result=True, cache_key_fn=content_key(_card_key),
      task_run_name="model-card {config.finetuning.stage}")
def model_card(config: RunConfig, trained: TrainResult, base_eval: Evaluation, tuned_eval: Evaluation,
               plots: list[str], dataset: BuiltDataset, run: MlflowRun) -> str:
    """README.md with Hugging Face front matter, before/after results, plots and the MLflow link; with
    `push_to_hub`, the model and this card published to the hub, once (a cached rerun uploads nothing)."""
    path = make_model_card(config, trained, base_eval, tuned_eval, plots, dataset, run)
    record_model_card(run, path)
    published = publish_model(config, trained.output_dir, path, run)
    if published:
        get_run_logger().info("published %s: %s", published["repo_id"], published["commit_url"])
    return path
