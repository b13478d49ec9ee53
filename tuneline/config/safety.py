"""Config values refused because they would leak a credential or write outside the folders the user chose.

A `user:password@` in the MLflow URI would travel into Prefect's stored results, the resolved config and the logged
model; MLflow reads the credential from `MLFLOW_TRACKING_USERNAME`/`PASSWORD`, which nothing records. An experiment
name becomes a folder under `mlartifacts/`: a name of dots would climb out."""

from __future__ import annotations

from urllib.parse import urlsplit


def url_has_credentials(uri: str | None) -> bool:
    """True when a URL carries a user or password before its host (`https://user:secret@host`)."""
    if not uri or "://" not in uri:
        return False
    try:
        parts = urlsplit(uri)
    except ValueError:
        return False
    return bool(parts.username or parts.password)


def safety_problems(config) -> list[str]:
    problems = []
    if url_has_credentials(config.pipeline.mlflow_tracking_uri):
        problems.append("'mlflow_tracking_uri' (from the config or $MLFLOW_TRACKING_URI) holds a user or password "
                        "before its host; it would be recorded with the run: give the address alone and set "
                        "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD in the environment")
    experiment = config.pipeline.mlflow_experiment
    if experiment and not experiment.strip("."):
        problems.append(f"'mlflow_experiment' is {experiment!r}: a name of dots only would put its artifacts "
                        "outside the store's mlartifacts/ folder; name the experiment")
    return problems
