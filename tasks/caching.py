"""Prefect cache keys from tuneline's content keys (Prefect's default key includes the run id)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from prefect.context import TaskRunContext


def content_key(key_of: Callable[..., str], complete: Callable[..., bool] | None = None):
    """A `cache_key_fn` returning the step's content key.

    `key_of(**parameters)` computes the key; `complete(key, **parameters)`, when given, checks that the result
    the key points at still exists whole. If not (someone deleted the folder, or a run was killed) while
    Prefect holds a record for the key, a one-off key makes the task run again instead of trusting the stale
    record. Without a record the real key is kept, so the fresh result is stored where the next run looks.
    Steps write content-addressed folders, so once rebuilt the old record points at a whole result again.
    """

    def cache_key_fn(context: TaskRunContext, parameters: dict[str, Any]) -> str:
        key = key_of(**parameters)
        if complete is not None and not complete(key, **parameters) and _has_record(context, key):
            return f"{key}-rerun-{uuid.uuid4().hex}"
        return key

    return cache_key_fn


def _has_record(context: TaskRunContext, key: str) -> bool:
    store = getattr(context, "result_store", None)
    return store is None or store.exists(key)
