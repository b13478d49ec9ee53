from prefect import task

from tasks.caching import content_key
from tuneline.config import RunConfig
from tuneline.pipeline import keys


def _predict_key(config: RunConfig, dataset: dict) -> str:
    from tuneline.evaluation import predict_fingerprint

    return predict_fingerprint(config, keys.base_model_key(config), dataset["fingerprint"])


def _in_place(key: str, config: RunConfig, dataset: dict) -> bool:
    """The cached answers are whole and output_dir still holds its copy of them."""
    from tuneline.evaluation import predictions_in_place

    return predictions_in_place(config, key)


@task(name="predict", persist_result=True, cache_key_fn=content_key(_predict_key, _in_place),
      task_run_name="predict {config.model.model_name_or_path}")
def predict(config: RunConfig, dataset: dict) -> dict:
    """Answer every prompt of the eval set with the configured model; score the answers as LLaMA-Factory does."""
    from tuneline.evaluation import predict_model

    return predict_model(config, dataset, keys.base_model_key(config))
