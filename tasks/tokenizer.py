from prefect import task

from tasks.caching import content_key
from tuneline.config import RunConfig
from tuneline.content.records import TokenizerInfo
from tuneline.identity import keys
from tuneline.pipeline.tokenizer_check import inspect_tokenizer


@task(name="load-tokenizer", task_run_name="load-tokenizer {config.model.model_name_or_path}",
      cache_key_fn=content_key(lambda config: keys.tokenizer_key(config)), persist_result=True)
def load_tokenizer(config: RunConfig) -> TokenizerInfo:
    """Load and check the tokenizer once; later steps get its fingerprint, never the object."""
    return inspect_tokenizer(config)
