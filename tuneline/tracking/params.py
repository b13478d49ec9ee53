"""The resolved config as MLflow params: flattened, stringified, secrets masked, safe to log again.

MLflow refuses to change a param's value, and a reopened run may resume with other settings: such a key keeps its
first value as the param and its newest goes to the tag `tuneline.resumed_with.<key>`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuneline.config.secrets import MASK, is_secret
from tuneline.tracking.runs import BATCH_TAGS, MAX_KEY, _chunks, _set_tags
from tuneline.tracking.store import client_for, uri_for

MAX_PARAM_VALUE = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
RESUMED_WITH_PREFIX = "tuneline.resumed_with."
RESUME_CHANGES_TAG = "tuneline.resume_changes"


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
    """Log what is new; return the keys whose value differs from the run's existing param (logged as tags, which
    always hold what the newest start ran with)."""
    from mlflow.entities import Param

    client = client_for(uri_for(run_id, tracking_uri))
    run = client.get_run(run_id)
    existing = run.data.params
    values = param_values(params)
    new, changed = [], {}
    for key, value in values.items():
        if key not in existing:
            new.append(Param(key, value))
        elif existing[key] != value:
            changed[key] = value
    for chunk in _chunks(new, BATCH_TAGS):
        client.log_batch(run_id, params=chunk)
    listed = [k for k in run.data.tags.get(RESUME_CHANGES_TAG, "").split(",") if k]
    all_changed = sorted(set(listed) | set(changed))
    if all_changed:
        newest = {f"{RESUMED_WITH_PREFIX}{k}": values[k] for k in all_changed if k in values}
        _set_tags(client, run_id, {**newest, RESUME_CHANGES_TAG: ",".join(all_changed)})
    return changed
