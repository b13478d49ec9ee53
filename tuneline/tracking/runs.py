"""One MLflow run per piece of work: open or reopen it by its content keys, tag it, finish it.

The run key names the training (a rerun reopens its newest unfinished run, so a crash-and-rerun keeps one history);
the work key names the exact work, so a finished run never stands for other work. A forced rerun gets a run of its
own."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from tuneline.errors import UserError
from tuneline.tracking.store import (
    client_for,
    default_artifact_location,
    remember_run,
    resolve_tracking_uri,
    sqlite_path,
    uri_for,
)

log = logging.getLogger(__name__)

RUN_KEY_TAG = "tuneline.run_key"
WORK_KEY_TAG = "tuneline.work_key"
FLOW_RUN_IDS_TAG = "tuneline.flow_run_ids"
MAX_TAG_VALUE = 8000  # MLflow's limit (mlflow.utils.validation.MAX_TAG_VAL_LENGTH)
MAX_KEY = 250
BATCH_TAGS = 100  # params + tags per log_batch request
BATCH_METRICS = 1000
UNFINISHED = ("RUNNING", "FAILED", "KILLED", "SCHEDULED")


def open_run(
    uri: str, experiment: str, run_key: str, run_name: str, tags: dict, artifact_location: str | None = None,
    reopen_finished: bool = False, work_key: str | None = None, fresh: bool = False,
) -> str:
    """Run id of the newest unfinished run with this run key (with `reopen_finished`, the newest finished one with this
    work key), else of a new run. A `fresh` start always gets a new run: a reopened one would hold another start's
    steps."""
    uri = resolve_tracking_uri(uri)
    client = client_for(uri)
    experiment_id = _experiment_id(client, uri, experiment, artifact_location)
    work_key = work_key or run_key
    run_id = None if fresh else _find_by_key(client, experiment_id, run_key, work_key, reopen_finished)
    all_tags = {**{k: str(v) for k, v in tags.items()}, RUN_KEY_TAG: run_key, WORK_KEY_TAG: work_key}
    if run_id is None:
        run_id = client.create_run(experiment_id, run_name=run_name, tags=_clip_tags(all_tags)).info.run_id
        log.info("MLflow: new run %s in experiment %r", run_id, experiment)
    else:
        client.update_run(run_id, status="RUNNING")
        _set_tags(client, run_id, all_tags)
        log.info("MLflow: reopened run %s (key %s)", run_id, run_key)
    remember_run(run_id, uri)
    return run_id


# MLflow's name for the kind (its UI lists it as "Finetuning"); which view opens is the link's to say (store.py).
EXPERIMENT_TAGS = {"mlflow.experimentKind": "finetuning"}


def _experiment_id(client, uri: str, name: str, artifact_location: str | None) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            raise UserError(
                f"MLflow experiment {name!r} in {uri} is deleted. Restore it (`mlflow experiments restore "
                f"--experiment-id {found.experiment_id}`), purge it (`mlflow gc`), or set mlflow_experiment "
                "to another name.",
                title="MLflow experiment unusable",
            )
        return found.experiment_id
    location = artifact_location or default_artifact_location(uri, name)
    try:
        return client.create_experiment(name, artifact_location=location, tags=EXPERIMENT_TAGS)
    except Exception:  # created meanwhile by a concurrent run: use it
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def _find_by_key(client, experiment_id: str, run_key: str, work_key: str, reopen_finished: bool) -> str | None:
    """An unfinished run continues whatever its work key; a finished one is reused only as this exact work (a
    run from before work keys were tagged counts as keyed by its run key)."""
    runs = client.search_runs(
        [experiment_id],
        filter_string=_key_filter(RUN_KEY_TAG, run_key),
        order_by=["attributes.start_time DESC"],
        max_results=50,
    )
    for run in runs:
        if run.info.status in UNFINISHED:
            return run.info.run_id
        if reopen_finished and run.data.tags.get(WORK_KEY_TAG, run_key) == work_key:
            return run.info.run_id
    return None


def finished_run_with_key(uri: str, experiment: str, work_key: str) -> str | None:
    """The newest FINISHED run of exactly this work (`work_key`) in `experiment`, without creating the experiment
    or a local store."""
    uri = resolve_tracking_uri(uri)
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        return None
    client = client_for(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None or found.lifecycle_stage == "deleted":
        return None
    runs = client.search_runs([found.experiment_id], filter_string=_key_filter(WORK_KEY_TAG, work_key) + " and "
                              "attributes.status = 'FINISHED'", order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.run_id if runs else None


def _key_filter(tag: str, key: str) -> str:
    escaped = key.replace("'", "\\'")
    return f"tags.`{tag}` = '{escaped}'"


def _clip_tags(tags: dict) -> dict[str, str]:
    return {str(k)[:MAX_KEY]: str(v)[:MAX_TAG_VALUE] for k, v in tags.items()}


def _set_tags(client, run_id: str, tags: dict) -> None:
    from mlflow.entities import RunTag

    items = [RunTag(k, v) for k, v in _clip_tags(tags).items()]
    for chunk in _chunks(items, BATCH_TAGS):
        client.log_batch(run_id, tags=chunk)


def _chunks(items: list, size: int) -> Iterable[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def add_tags(run_id: str, tags: dict, *, tracking_uri: str | None = None) -> None:
    if tags:
        _set_tags(client_for(uri_for(run_id, tracking_uri)), run_id, tags)


def tag_flow_run(run_id: str, flow_run_id: str, url: str | None, *, tracking_uri: str | None = None) -> None:
    """Record every Prefect flow run that worked on this MLflow run; the latest also as `prefect.*` tags."""
    client = client_for(uri_for(run_id, tracking_uri))
    current = client.get_run(run_id).data.tags.get(FLOW_RUN_IDS_TAG, "")
    ids = [i for i in current.split(",") if i]
    if flow_run_id not in ids:
        ids.append(flow_run_id)
    joined = ",".join(ids)
    while len(joined) > MAX_TAG_VALUE:  # keep the newest ids when the list outgrows a tag
        ids.pop(0)
        joined = ",".join(ids)
    tags = {FLOW_RUN_IDS_TAG: joined, "prefect.flow_run_id": flow_run_id}
    if url:
        tags["prefect.flow_run_url"] = url
    _set_tags(client, run_id, tags)


def log_metrics(run_id: str, metrics: dict, step: int | None = None, *, tracking_uri: str | None = None) -> None:
    """Log final or one-off metrics (evaluation results); `step` defaults to 0 as in MLflow."""
    send_metrics(
        client_for(uri_for(run_id, tracking_uri)),
        run_id,
        [(k, float(v), step or 0) for k, v in metrics.items() if v is not None],
    )


def send_metrics(client, run_id: str, entries: list[tuple], timestamp_ms: int | None = None) -> None:
    """log_batch in chunks of MLflow's per-request limit; entries are (key, value, step[, timestamp_ms])."""
    from mlflow.entities import Metric

    now = timestamp_ms or int(time.time() * 1000)
    items = [Metric(e[0], float(e[1]), e[3] if len(e) > 3 and e[3] else now, int(e[2])) for e in entries]
    for chunk in _chunks(items, BATCH_METRICS):
        client.log_batch(run_id, metrics=chunk)


def log_dataset_input(run_id: str, name: str, digest: str, source: dict, profile: dict, context: str, *,
                      tracking_uri: str | None = None) -> None:
    """The data the run used, as an MLflow dataset input: the UI's Dataset column and the run's inputs show it."""
    import json

    from mlflow.entities import Dataset, DatasetInput, InputTag

    dataset = Dataset(name=name, digest=digest, source_type="local", source=json.dumps(source),
                      profile=json.dumps(profile))
    client_for(uri_for(run_id, tracking_uri)).log_inputs(
        run_id, datasets=[DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)])])


def finish_run(run_id: str, status: str = "FINISHED", *, tracking_uri: str | None = None) -> None:
    """Mark the run done (FINISHED), or FAILED/KILLED so the next start of the same work reopens it."""
    client_for(uri_for(run_id, tracking_uri)).set_terminated(run_id, status=status)


def get_run_metrics(uri: str, run_id: str) -> dict[str, float]:
    """The latest value of every metric of the run."""
    return dict(client_for(resolve_tracking_uri(uri)).get_run(run_id).data.metrics)


def get_run_tags(uri: str, run_id: str) -> dict[str, str]:
    return dict(client_for(resolve_tracking_uri(uri)).get_run(run_id).data.tags)


def metric_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """Every (step, value) logged for `key`, by step."""
    history = client_for(resolve_tracking_uri(uri)).get_metric_history(run_id, key)
    return sorted(((m.step, m.value) for m in history), key=lambda sv: sv[0])
