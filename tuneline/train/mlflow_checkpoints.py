"""Checkpoints kept in the flow's MLflow run, so a resume on a machine with an empty output_dir continues.

Uploading from `on_save` is safe because TunelineTrainer's `_save_checkpoint` returns only after the rename, so
what is uploaded is whole (a test pins this order). A failed upload only warns."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from transformers import TrainerCallback

from tuneline.errors import UserError
from tuneline.runtime.contract import LOG_FILE
from tuneline.train.checkpoints import TRAINER_STATE, checkpoint_step, is_complete, last_complete_checkpoint
from tuneline.train.trainer_log import rebuild_log

log = logging.getLogger(__name__)


def _mlflow_target() -> tuple[str | None, str | None]:
    """The flow's run and store, as the launcher passes them to the training process."""
    return os.environ.get("MLFLOW_RUN_ID"), os.environ.get("MLFLOW_TRACKING_URI")


def _run_keys(output_dir: str | Path) -> dict[str, str | None]:
    """The train and resume keys run.json holds (None where it has none)."""
    from tuneline.runtime.contract import read_run_file

    found = read_run_file(output_dir) or {}
    return {"train_key": found.get("train_key"), "resume_key": found.get("resume_key")}


class MlflowCheckpointCallback(TrainerCallback):
    """Logs every saved checkpoint to the MLflow run (main process only), marked with the run's keys."""

    def __init__(self, output_dir: str | Path):
        self.output_dir = Path(output_dir)
        self.logged: list[str] = []  # artifact paths logged by this process, for callers and tests

    def on_save(self, args, state, control, **kwargs):
        run_id, uri = _mlflow_target()
        if not (state.is_world_process_zero and run_id and uri):
            return
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not is_complete(checkpoint):  # never upload what a resume must not trust
            log.warning("%s is not a complete checkpoint at on_save; not logged to MLflow", checkpoint)
            return
        from tuneline.tracking import log_checkpoint

        logged = log_checkpoint(run_id, checkpoint, tracking_uri=uri, **_run_keys(self.output_dir))
        if logged:
            self.logged.append(logged)
            if args.save_total_limit:  # MLflow keeps what output_dir keeps, not every checkpoint ever saved
                from tuneline.tracking import prune_logged_checkpoints

                best = Path(state.best_model_checkpoint).name if state.best_model_checkpoint else None
                prune_logged_checkpoints(run_id, args.save_total_limit, tracking_uri=uri, protect=best)


def _explicit_resume_path(config) -> bool:
    value = config.training.get("resume_from_checkpoint")
    return isinstance(value, (str, Path)) and str(value).lower() not in ("", "true", "false")


def _clear_stale_downloads(output_dir: Path) -> None:
    """Drop what a download killed midway left (never resumed from: it was not renamed into place)."""
    from tuneline.tracking.artifacts import DOWNLOAD_PREFIX

    if output_dir.is_dir():
        for entry in output_dir.glob(f"{DOWNLOAD_PREFIX}checkpoint-*"):
            shutil.rmtree(entry, ignore_errors=True)


def restore_checkpoint_from_mlflow(config, output_dir: str | Path) -> Path | None:
    """Download the MLflow run's last complete checkpoint into an output_dir that has none; its path, or None.

    A checkpoint logged for another train key and another resume key is passed over. An unreachable store is a
    UserError: silently starting over would throw away the work the run already did."""
    from tuneline.tracking import check_tracking_available, download_latest_checkpoint, resolve_tracking_uri
    from tuneline.tracking.store import is_transient

    run_id, env_uri = _mlflow_target()
    output_dir = Path(output_dir)
    if not (config.pipeline.mlflow_log_checkpoints and run_id) or _explicit_resume_path(config):
        return None
    if last_complete_checkpoint(output_dir) is not None:
        return None
    uri = resolve_tracking_uri(env_uri or config.pipeline.mlflow_tracking_uri)
    _clear_stale_downloads(output_dir)
    try:
        check_tracking_available(uri)
        restored = download_latest_checkpoint(run_id, uri, output_dir, **_run_keys(output_dir))
    except Exception as err:
        if not (isinstance(err, UserError) or is_transient(err)):
            raise
        raise UserError(
            f"output_dir '{output_dir}' has no checkpoint and the checkpoints of MLflow run {run_id} in {uri} "
            f"cannot be fetched ({err}). Start the tracking server and run again, or set "
            "'mlflow_log_checkpoints: false' to train from the start.",
            title="tuneline cannot resume",
        ) from err
    if restored is None:
        return None
    if not is_complete(restored):
        raise UserError(f"the checkpoint {restored.name} downloaded from MLflow run {run_id} has no "
                        "trainer_state.json: it cannot be resumed from. Delete it and run again.",
                        title="tuneline cannot resume")
    log.info("resuming from %s (step %s), downloaded from MLflow run %s", restored, checkpoint_step(restored), run_id)
    return restored


def restore_into_run_file(config) -> Path | None:
    """The launcher's hook, on the main process when output_dir has no local checkpoint: restore into it and record
    the resume point in run.json."""
    from tuneline.runtime.contract import write_run_file

    restored = restore_checkpoint_from_mlflow(config, config.output_dir)
    if restored is not None:
        state = json.loads((restored / TRAINER_STATE).read_text())
        rebuild_log(Path(config.output_dir) / LOG_FILE, state.get("log_history") or [])
        write_run_file(config.output_dir, resumed_from=str(restored), resumed_step=checkpoint_step(restored),
                       restored_from_mlflow=True)
    return restored
