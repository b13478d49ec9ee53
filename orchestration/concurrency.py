"""Concurrency limits on the Prefect API: the `gpu` tag's (how many `train` steps run at once) and the one-slot
locks that make retrains of one model promote in turn.

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


def one_at_a_time(name: str):
    """A global concurrency limit of one slot, created if missing (Prefect enforces no limit that doesn't exist):
    `with one_at_a_time(name):` blocks while another run holds it."""
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
            except ObjectAlreadyExists:  # created meanwhile by the other run
                pass
    return concurrency(name, occupy=1, strict=True)
