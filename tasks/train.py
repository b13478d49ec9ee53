from collections.abc import Callable

import httpx
from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.runtime import task_run

from tasks.caching import content_key
from tuneline.config import RunConfig
from tuneline.content.records import BuiltDataset, ReferenceLogps
from tuneline.identity import keys
from tuneline.pipeline.launch import run_streaming
from tuneline.pipeline.record import record_training
from tuneline.pipeline.records import MlflowRun, TrainResult
from tuneline.pipeline.terminal_progress import terminal_progress
from tuneline.pipeline.train_step import finished_for, prepare_training, worth_retrying


def _train_key(config: RunConfig, dataset: BuiltDataset, reference: ReferenceLogps, run: MlflowRun) -> str:
    return keys.train_key(config, dataset.fingerprint, reference.fingerprint)


def whole_percent_steps(update: Callable[[float], object]) -> Callable[[dict], None]:
    """A trainer_log entry handler that calls `update(percent)` only when the training's whole percent advanced:
    a run of hours makes ~100 progress updates, not one per logging step."""
    shown = [0]

    def on_progress(entry: dict) -> None:
        percent = entry.get("percentage")
        if isinstance(percent, (int, float)) and int(percent) > shown[0]:
            shown[0] = int(percent)
            update(min(100.0, float(percent)))

    return on_progress


def progress_updater(progress_id, warn: Callable[[str], None]) -> Callable[[float], None]:
    """`update(percent)` for the task's progress artifact. A progress bar must never end a training: when the
    Prefect API does not answer (after its client's own retries), `warn` is told once and updates stop, while the
    training goes on and its result is stored as usual."""
    unreachable = []

    def update(percent: float) -> None:
        if unreachable:
            return
        try:
            update_progress_artifact(progress_id, percent)
        except httpx.HTTPError as err:
            unreachable.append(err)
            warn(f"the Prefect API did not answer ({err}); training goes on, its progress is no longer shown")

    return update


def _retry_crashes_only(task, task_run, state) -> bool:
    try:
        state.result()
    except BaseException as error:  # noqa: BLE001 - the state's own exception, re-raised by result()
        return worth_retrying(error)
    return False


@task(name="train", tags=["gpu"], retries=1, retry_delay_seconds=5, persist_result=True,
      retry_condition_fn=_retry_crashes_only,
      task_run_name="train {config.finetuning.stage}-{config.finetuning.finetuning_type}",
      cache_key_fn=content_key(_train_key, lambda key, config, dataset, reference, **_: finished_for(
          config, key, dataset, reference)))
def train(config: RunConfig, dataset: BuiltDataset, reference: ReferenceLogps, run: MlflowRun) -> TrainResult:
    """Launch (or resume) training in a subprocess; Prefect retries launch again and the child resumes.

    The task runs the child itself, so that the streaming is all that sits between it and the training. The child's
    output lines go to the task's log (Prefect's log worker sends them to the API in batches).
    """
    logger = get_run_logger()
    progress = create_progress_artifact(progress=0.0, key="training-progress", description="training progress")
    show_progress = progress_updater(progress, logger.warning)
    artifact_progress, bar = whole_percent_steps(show_progress), terminal_progress()

    def on_progress(entry: dict) -> None:
        artifact_progress(entry)
        if bar:
            bar(entry)

    fresh = config.pipeline.refresh_cache and task_run.run_count <= 1  # a retry resumes what the first began
    launch = prepare_training(config, dataset, reference, _train_key(config, dataset, reference, run),
                              run.run_id, run.tracking_uri, on_line=logger.info,
                              on_progress=on_progress, start_fresh=fresh)
    try:
        if launch.command:  # else a finished training stands for this key
            run_streaming(launch.command, launch.env, launch.forward)
        result = launch.result()
    finally:
        launch.release()  # the output_dir's lock, taken once for this training (also by a retry)
        if bar:
            bar.close()
    show_progress(100.0)
    record_training(run, config, result)
    return result
