"""Prefect cache keys from tuneline's content keys (Prefect's default key includes the run id)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from prefect.context import TaskRunContext


def content_key(key_of: Callable[..., str], complete: Callable[..., bool] | None = None):
    """A `cache_key_fn` returning the step's content key.

    `key_of(**parameters)` computes the key; `complete(key, **parameters)`, when given, checks that the result
    the key points at still exists whole. If not (someone deleted the folder, or a run was killed), a
    one-off key forces the task to run again instead of trusting a stale record.
    """

    def cache_key_fn(context: TaskRunContext, parameters: dict[str, Any]) -> str:
        key = key_of(**parameters)
        if complete is not None and not complete(key, **parameters):
            return f"{key}-rerun-{uuid.uuid4().hex}"
        return key

    return cache_key_fn
