"""The only part of tuneline that talks to MLflow.

Every call names its store explicitly; nothing uses MLflow's process-global active run. `mlflow` itself is imported
only when a function runs."""

from tuneline.tracking.artifacts import (
    download_latest_checkpoint,
    download_logged_model,
    log_and_register_model,
    log_artifacts,
    log_checkpoint,
    prune_logged_checkpoints,
    register_model,
)
from tuneline.tracking.background import BackgroundStepLogger
from tuneline.tracking.params import flatten, log_params, param_values
from tuneline.tracking.registry import alias_version, download_version, set_alias, tag_version
from tuneline.tracking.runs import (
    add_tags,
    finish_run,
    finished_run_with_key,
    get_run_metrics,
    get_run_tags,
    log_dataset_input,
    log_metrics,
    metric_history,
    open_run,
    tag_flow_run,
)
from tuneline.tracking.step_logger import StepMetricLogger, flush_spool
from tuneline.tracking.store import (
    check_tracking_available,
    open_stores,
    resolve_tracking_uri,
    run_url,
    ui_command,
)

__all__ = [
    "alias_version",
    "download_version",
    "set_alias",
    "tag_version",
    "BackgroundStepLogger",
    "StepMetricLogger",
    "add_tags",
    "check_tracking_available",
    "open_stores",
    "download_latest_checkpoint",
    "download_logged_model",
    "finish_run",
    "finished_run_with_key",
    "flatten",
    "flush_spool",
    "get_run_metrics",
    "get_run_tags",
    "log_and_register_model",
    "log_artifacts",
    "log_checkpoint",
    "prune_logged_checkpoints",
    "log_dataset_input",
    "log_metrics",
    "log_params",
    "metric_history",
    "open_run",
    "param_values",
    "register_model",
    "resolve_tracking_uri",
    "run_url",
    "tag_flow_run",
    "ui_command",
]
