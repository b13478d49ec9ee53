"""The resolved config as MLflow params: flattened, stringified, secrets masked, safe to log again.

MLflow refuses to change a param's value. On a reopened run (same work key) the config is normally identical,
so unchanged params are skipped; a key whose value did change (a key outside the work key, such as logging
options) keeps its first value as the param and gets the new value as the tag `param_changed.<key>`, so the run
shows both without failing the resumed flow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuneline.secrets import MASK, is_secret
from tuneline.tracking.runs import BATCH_TAGS, MAX_KEY, _chunks, _set_tags
from tuneline.tracking.store import client_for, uri_for

MAX_PARAM_VALUE = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
CHANGED_PREFIX = "param_changed."


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts become dotted keys: {"a": {"b": 1}} -> {"a.b": 1}."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def param_values(config: Mapping[str, Any]) -> dict[str, str]:
    """Flattened, masked, stringified and truncated to MLflow's limits."""
    out: dict[str, str] = {}
    for key, value in flatten(config).items():
        if is_secret(key) and value not in (None, ""):
            text = MASK
        else:
            text = str(value)
        out[key[:MAX_KEY]] = text[:MAX_PARAM_VALUE]
    return out


def log_params(run_id: str, params: Mapping[str, Any], *, tracking_uri: str | None = None) -> dict[str, str]:
    """Log what is new; return the keys whose value differs from the run's existing param (logged as tags)."""
    from mlflow.entities import Param

    client = client_for(uri_for(run_id, tracking_uri))
    existing = client.get_run(run_id).data.params
    new, changed = [], {}
    for key, value in param_values(params).items():
        if key not in existing:
            new.append(Param(key, value))
        elif existing[key] != value:
            changed[key] = value
    for chunk in _chunks(new, BATCH_TAGS):
        client.log_batch(run_id, params=chunk)
    if changed:
        _set_tags(client, run_id, {f"{CHANGED_PREFIX}{k}": v for k, v in changed.items()})
    return changed
