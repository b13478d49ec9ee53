"""Files in the run: outputs, checkpoints (so a resume elsewhere can fetch the last one), and the final model.

The final model is a pyfunc model holding the saved folder as it is (`tracking.served_model`): MLflow's transformers
flavour would load the model (a LoRA's base too) just to log it, and write a second copy of the weights."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path

from tuneline.errors import UserError
from tuneline.tracking.runs import MAX_TAG_VALUE
from tuneline.tracking.served_model import model_files, save_served_model
from tuneline.tracking.step_logger import default_http_retries
from tuneline.tracking.store import check_tracking_available, client_for, is_transient, resolve_tracking_uri, uri_for

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
CHECKPOINT_MARKER = "TUNELINE_CHECKPOINT_COMPLETE"  # uploaded last: a checkpoint without it is partial
MODEL_PATH = "model"
DOWNLOAD_PREFIX = ".tmp-"  # a checkpoint being downloaded: `<dest>/.tmp-checkpoint-N-<id>`
_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


def log_artifacts(
    run_id: str, local_path: str | Path, artifact_path: str | None = None, *, tracking_uri: str | None = None
) -> None:
    """Log a file or a whole folder (its contents go under `artifact_path`)."""
    local_path = Path(local_path)
    client = client_for(uri_for(run_id, tracking_uri))
    if local_path.is_dir():
        client.log_artifacts(run_id, str(local_path), artifact_path)
    elif local_path.is_file():
        client.log_artifact(run_id, str(local_path), artifact_path)
    else:
        raise FileNotFoundError(f"nothing to log at {local_path}")


def log_checkpoint(
    run_id: str, checkpoint_dir: str | Path, *, tracking_uri: str | None = None, train_key: str | None = None,
    resume_key: str | None = None,
) -> str | None:
    """Upload a complete checkpoint to `checkpoints/<name>`, then its completion marker (naming the keys it belongs
    to); returns that path. With the server unreachable it warns and returns None: the checkpoint is safe on disk."""
    checkpoint_dir = Path(checkpoint_dir)
    artifact_path = f"{CHECKPOINTS}/{checkpoint_dir.name}"
    uri = uri_for(run_id, tracking_uri)
    try:
        check_tracking_available(uri, timeout_s=5)  # fail in seconds, not after MLflow's minutes of retries
        client = client_for(uri)
        with default_http_retries(), tempfile.TemporaryDirectory() as tmp:
            client.log_artifacts(run_id, str(checkpoint_dir), artifact_path)
            marker = Path(tmp) / CHECKPOINT_MARKER
            marker.write_text(json.dumps({"checkpoint": checkpoint_dir.name, "train_key": train_key,
                                          "resume_key": resume_key}))
            client.log_artifact(run_id, str(marker), artifact_path)
    except Exception as err:
        if not (isinstance(err, UserError) or is_transient(err)):
            raise
        log.warning("checkpoint %s not logged to MLflow (%s); training goes on", checkpoint_dir.name, err)
        return None
    return artifact_path


def prune_logged_checkpoints(run_id: str, keep: int, *, tracking_uri: str | None = None,
                             protect: str | None = None) -> list[str]:
    """Delete all but the `keep` newest complete checkpoints of the run (never `protect`), as `save_total_limit` does
    on disk; returns the names deleted.

    Each loses its completion marker first, so one half deleted is never trusted. A store that cannot delete keeps
    them, with a warning."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    uri = uri_for(run_id, tracking_uri)
    deleted = []
    try:
        client = client_for(uri)
        complete = logged_checkpoints(client, run_id)
        complete_names = {name for _, name in complete}
        kept = {name for _, name in complete[:keep]} | {protect}
        newest = complete[0][0] if complete else -1
        names = [info.path.rsplit("/", 1)[-1] for info in client.list_artifacts(run_id, CHECKPOINTS) if info.is_dir]
        steps = {name: int(match.group(1)) for name in names if (match := _CHECKPOINT_NAME.match(name))}
        doomed = [name for name, step in steps.items() if name not in kept and step < newest]
        repo = get_artifact_repository(client.get_run(run_id).info.artifact_uri, tracking_uri=uri)
        for name in doomed:
            if name in complete_names:
                repo.delete_artifacts(f"{CHECKPOINTS}/{name}/{CHECKPOINT_MARKER}")
            repo.delete_artifacts(f"{CHECKPOINTS}/{name}")
            deleted.append(name)
    except Exception as err:  # noqa: BLE001 - pruning runs inside training and must never stop it
        log.warning("old checkpoints not pruned from MLflow (%s); they stay", err)
    return deleted


def logged_checkpoints(client, run_id: str) -> list[tuple[int, str]]:
    """(step, name) of every checkpoint logged completely, highest step first."""
    found = []
    for info in client.list_artifacts(run_id, CHECKPOINTS):
        name = info.path.rsplit("/", 1)[-1]
        match = _CHECKPOINT_NAME.match(name)
        if info.is_dir and match:
            found.append((int(match.group(1)), name))
    complete = []
    for step, name in sorted(found, reverse=True):
        files = {i.path.rsplit("/", 1)[-1] for i in client.list_artifacts(run_id, f"{CHECKPOINTS}/{name}")}
        if CHECKPOINT_MARKER in files:
            complete.append((step, name))
    return complete


def _marker_keys(client, run_id: str, name: str) -> dict:
    """The keys written in a checkpoint's marker (none for a marker holding only the checkpoint name)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = client.download_artifacts(run_id, f"{CHECKPOINTS}/{name}/{CHECKPOINT_MARKER}", tmp)
        text = Path(path).read_text(encoding="utf-8")
    try:
        meta = json.loads(text)
    except json.JSONDecodeError:  # a marker holding only the checkpoint name
        return {}
    return meta if isinstance(meta, dict) else {}


def latest_logged_checkpoint(client, run_id: str, train_key: str | None = None,
                             resume_key: str | None = None) -> str | None:
    """Name of the highest complete checkpoint of the run whose marker names `train_key`, or `resume_key` (a run
    that differs only in what does not shape the weights: logging, saving), or no key."""
    for _, name in logged_checkpoints(client, run_id):
        if train_key is None:
            return name
        logged = _marker_keys(client, run_id, name)
        if logged.get("train_key") in (None, train_key) or (resume_key and logged.get("resume_key") == resume_key):
            return name
        log.warning("MLflow run %s: %s belongs to train key %s, not %s; skipped", run_id, name,
                    logged.get("train_key"), train_key)
    return None


def download_latest_checkpoint(
    run_id: str, tracking_uri: str | None, dest_dir: str | Path, *, train_key: str | None = None,
    resume_key: str | None = None,
) -> Path | None:
    """Fetch the highest complete `checkpoint-N` into `dest_dir/<name>`; None when the run logged none.

    With `train_key`, checkpoints logged for another key are passed over, unless `resume_key` is theirs. An existing
    `dest_dir/<name>` is returned as it is."""
    client = client_for(uri_for(run_id, tracking_uri))
    name = latest_logged_checkpoint(client, run_id, train_key, resume_key)
    if name is None:
        return None
    dest_dir = Path(dest_dir)
    final = dest_dir / name
    if final.exists():
        return final
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = dest_dir / f"{DOWNLOAD_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        client.download_artifacts(run_id, f"{CHECKPOINTS}/{name}", str(tmp))
        fetched = tmp / name
        (fetched / CHECKPOINT_MARKER).unlink(missing_ok=True)
        os.replace(fetched, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("downloaded %s of MLflow run %s into %s", name, run_id, final)
    return final


def download_logged_model(run_id: str, dest_dir: str | Path, *, tracking_uri: str | None = None) -> Path | None:
    """The run's logged final model (`model/`) downloaded into `dest_dir`; returns the folder of the model's own
    files (inside the MLflow model), None when the run logged none."""
    client = client_for(uri_for(run_id, tracking_uri))
    if not client.list_artifacts(run_id, MODEL_PATH):
        return None
    return model_files(Path(client.download_artifacts(run_id, MODEL_PATH, str(dest_dir))))


def _model_readme(loading_recipe: str, registered_name: str | None, files: str) -> str:
    where = f"registered model `{registered_name}`" if registered_name else "this run"
    uri = f"models:/{registered_name}/<version>" if registered_name else "runs:/<run id>/model"
    return (
        f"# Model logged by tuneline\n\nThe final model or adapter of {where}, as an MLflow model:\n\n"
        f"```python\nimport mlflow\nmodel = mlflow.pyfunc.load_model('{uri}')\n"
        "print(model.predict({'prompt': 'Hello!'})[0]['answer'])\n```\n\n"
        f"`{files}/` holds the files as the trainer saved them; they load without MLflow too:\n\n"
        f"```python\n{loading_recipe.strip()}\n```\n"
    )


def log_and_register_model(
    run_id: str,
    model_dir: str | Path,
    registered_name: str | None,
    tags: dict,
    loading_recipe: str,
    serving: dict,
    requirements: list[str],
    *,
    tracking_uri: str | None = None,
) -> str | None:
    """Log `model_dir` under `model/` as an MLflow model and register a version if a name is given (its number, else
    None). The version's tags gain the run's latest metrics as `metric.<key>` unless `tags` sets them."""
    uri = uri_for(run_id, tracking_uri)
    client = client_for(uri)
    with tempfile.TemporaryDirectory() as tmp:
        packaged = save_served_model(Path(model_dir), Path(tmp) / MODEL_PATH, serving, requirements)
        files = model_files(packaged).relative_to(packaged).as_posix()
        (packaged / "TUNELINE_LOADING.md").write_text(_model_readme(loading_recipe, registered_name, files),
                                                      encoding="utf-8")
        client.log_artifacts(run_id, str(packaged), MODEL_PATH)
    if not registered_name:
        return None
    return _register(client, uri, run_id, registered_name, tags)


def register_model(run_id: str, registered_name: str, tags: dict, *, tracking_uri: str | None = None) -> str:
    """Register the run's already logged `model/` as a new version (after evaluation, so it carries results)."""
    uri = uri_for(run_id, tracking_uri)
    return _register(client_for(uri), uri, run_id, registered_name, tags)


def _register(client, uri: str, run_id: str, name: str, tags: dict) -> str:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        try:
            client.create_registered_model(name, description="Fine-tuned with tuneline.")
        except MlflowException:  # registered meanwhile by a concurrent run
            client.get_registered_model(name)
    run = client.get_run(run_id)
    version_tags = {f"metric.{k}": v for k, v in run.data.metrics.items()}
    version_tags.update(tags)
    version_tags.setdefault("tuneline.run_id", run_id)
    source = f"{run.info.artifact_uri.rstrip('/')}/{MODEL_PATH}"
    version = client.create_model_version(
        name,
        source,
        run_id=run_id,
        tags={str(k): str(v)[:MAX_TAG_VALUE] for k, v in version_tags.items()},
        await_creation_for=0,
    )
    log.info("registered %s version %s from run %s in %s", name, version.version, run_id, resolve_tracking_uri(uri))
    return str(version.version)
