from prefect import task

from tasks.caching import content_key
from tuneline.config import RunConfig
from tuneline.content.records import BuiltDataset, Prediction
from tuneline.identity import keys


def _predict_key(config: RunConfig, dataset: BuiltDataset) -> str:
    return keys.predict_key(config, keys.base_model_key(config), dataset.fingerprint)


def _in_place(key: str, config: RunConfig, dataset: BuiltDataset) -> bool:
    """The cached answers are whole and output_dir still holds its copy of them."""
    from tuneline.evaluation import predictions_in_place

    return predictions_in_place(config, key)


@task(name="predict", persist_result=True, cache_key_fn=content_key(_predict_key, _in_place),
      task_run_name="predict {config.model.model_name_or_path}")
def predict(config: RunConfig, dataset: BuiltDataset) -> Prediction:
    """Answer every prompt of the eval set with the configured model; score the answers as LLaMA-Factory does."""
    from tuneline.evaluation import predict_model

    return Prediction.from_stored(predict_model(config, dataset, keys.base_model_key(config)))
