from prefect import task

from tasks.caching import content_key
from tuneline.config import RunConfig
from tuneline.content.records import BuiltDataset, Evaluation
from tuneline.identity import keys
from tuneline.pipeline.records import TrainResult


def _model_key(config: RunConfig, trained: TrainResult | None) -> str:
    return trained.train_key if trained else keys.base_model_key(config)


def _eval_key(config: RunConfig, dataset: BuiltDataset, trained: TrainResult | None = None) -> str:
    return keys.evaluation_key(config, _model_key(config, trained), dataset.fingerprint)


@task(name="evaluate", persist_result=True, cache_key_fn=content_key(_eval_key),
      task_run_name="evaluate {config.model.model_name_or_path}")
def evaluate(config: RunConfig, dataset: BuiltDataset, trained: TrainResult | None = None) -> Evaluation:
    """Score the base model (trained=None, shared by every run on that base) or the tuned one."""
    from tuneline.evaluation import evaluate_model

    adapter_dir = trained.output_dir if trained else None
    return Evaluation.from_stored(evaluate_model(config, dataset, adapter_dir, _model_key(config, trained)))
