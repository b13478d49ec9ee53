from prefect import task

from tasks.caching import content_key
from tuneline.config import RunConfig
from tuneline.content.records import BuiltDataset, ReferenceLogps
from tuneline.identity import keys
from tuneline.pipeline.cache_checks import reference_complete


@task(name="build-reference-model", task_run_name="build-reference-model {config.finetuning.stage}",
      cache_key_fn=content_key(lambda config, dataset: keys.reference_key(config, dataset.fingerprint),
                               lambda key, config, dataset: reference_complete(config, key)),
      persist_result=True)
def build_reference_model(config: RunConfig, dataset: BuiltDataset) -> ReferenceLogps:
    """Precompute the reference log-probs of the rows the run visits (its key names them, so a longer run is a new
    key whose build computes only the rows not stored yet); says so when the stage needs none."""
    from tuneline.reference import build_reference_logps

    return ReferenceLogps.from_stored(build_reference_logps(config, dataset))
