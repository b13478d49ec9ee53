"""Whether a cached step's output is still whole on disk, so that Prefect's record of it is not trusted alone."""

from __future__ import annotations

from tuneline.config import RunConfig
from tuneline.content.step_cache import entry_dir, is_complete


def dataset_complete(config: RunConfig, key: str) -> bool:
    from tuneline.data.build import usable_entry

    location = config.data.tokenized_path or entry_dir(config.pipeline.pipeline_cache_dir, "build-dataset", key)
    return usable_entry(location)  # a damaged entry is set aside here


def reference_complete(config: RunConfig, key: str) -> bool:
    from tuneline.reference import needs_reference

    if not needs_reference(config):
        return True
    return is_complete(entry_dir(config.pipeline.pipeline_cache_dir, "build-reference-model", key))
