"""The `gpu` tag's concurrency limit: how many `train` steps run at once against this Prefect API.

Every `train` task carries the tag; without a limit Prefect would start as many trainings as there are due runs,
all on the same GPUs. The limit is created when deployments are served (`tuneline serve`), and kept if someone
already set one: `prefect concurrency-limit create gpu N` changes it.
"""

from __future__ import annotations

import asyncio
import os

GPU_TAG = "gpu"
SLOTS_ENV = "TUNELINE_GPU_SLOTS"  # default: one training at a time


def ensure_gpu_limit() -> int:
    """The limit in force, created with $TUNELINE_GPU_SLOTS (default 1) slots when there is none."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    async def ensure() -> int:
        async with get_client() as client:
            try:
                return (await client.read_concurrency_limit_by_tag(GPU_TAG)).concurrency_limit
            except ObjectNotFound:
                slots = int(os.environ.get(SLOTS_ENV, "1"))
                await client.create_concurrency_limit(tag=GPU_TAG, concurrency_limit=slots)
                return slots

    return asyncio.run(ensure())
