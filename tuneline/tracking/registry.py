"""Registered-model aliases and version tags: where the retrain flow reads and records its promotion decisions."""

from __future__ import annotations

from pathlib import Path

from tuneline.tracking.served_model import model_files
from tuneline.tracking.store import client_for, resolve_tracking_uri


def alias_version(uri: str, name: str, alias: str) -> dict | None:
    """{version, run_id, tags} of the version `alias` points at, or None (no such model or alias)."""
    from mlflow.exceptions import MlflowException

    try:
        found = client_for(resolve_tracking_uri(uri)).get_model_version_by_alias(name, alias)
    except MlflowException:
        return None
    return {"version": str(found.version), "run_id": found.run_id, "tags": dict(found.tags or {})}


def set_alias(uri: str, name: str, alias: str, version: str) -> None:
    client_for(resolve_tracking_uri(uri)).set_registered_model_alias(name, alias, version)


def tag_version(uri: str, name: str, version: str, tags: dict) -> None:
    client = client_for(resolve_tracking_uri(uri))
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, str(value))


def download_version(uri: str, name: str, version: str, dest: Path) -> Path:
    """The version's MLflow model fetched into `dest` (once: a registered version never changes); returns the
    folder of the model's own files inside it, which loads and evaluates as the trainer's output folder does."""
    import os
    import shutil

    if dest.is_dir():
        return model_files(dest)
    client = client_for(resolve_tracking_uri(uri))
    source = client.get_model_version_download_uri(name, version)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    from mlflow.artifacts import download_artifacts

    fetched = Path(download_artifacts(artifact_uri=source, dst_path=str(tmp), tracking_uri=resolve_tracking_uri(uri)))
    os.replace(fetched, dest)
    shutil.rmtree(tmp, ignore_errors=True)
    return model_files(dest)
