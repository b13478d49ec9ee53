from prefect import task

from tasks.caching import content_key
from tuneline.config import RunConfig
from tuneline.content.records import BuiltDataset, TokenizerInfo
from tuneline.identity import keys
from tuneline.pipeline.cache_checks import dataset_complete


@task(name="build-dataset", task_run_name="build-dataset {config.data.dataset}",
      cache_key_fn=content_key(lambda config, tokenizer: keys.dataset_key(config),
                               lambda key, config, tokenizer: dataset_complete(config, key)),
      persist_result=True)
def build_dataset(config: RunConfig, tokenizer: TokenizerInfo) -> BuiltDataset:
    """Tokenize for the stage and store by content; returns path, fingerprint and row counts."""
    from tuneline.data import build_dataset as build

    return BuiltDataset.from_stored(build(config))
