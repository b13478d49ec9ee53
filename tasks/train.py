from collections.abc import Callable

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.runtime import task_run

from tasks.caching import content_key
from tasks.child_log import ChildLog
from tuneline.config import RunConfig
from tuneline.pipeline import keys
from tuneline.pipeline.record import record_training
from tuneline.pipeline.train_step import train_model, training_complete, worth_retrying


def _train_key(config: RunConfig, dataset: dict, reference: dict, run: dict) -> str:
    return keys.train_key(config, dataset["fingerprint"], reference["fingerprint"])


def whole_percent_steps(update: Callable[[float], object]) -> Callable[[dict], None]:
    """A trainer_log entry handler that calls `update(percent)` only when the training's whole percent advanced.

    train_model hands entries on at most every 5 s; each update is an API call and a database write on the
    server, taking CPU from a CPU training. A run of hours then makes ~100 of them instead of one every 5 s.
    """
    shown = [0]

    def on_progress(entry: dict) -> None:
        percent = entry.get("percentage")
        if isinstance(percent, (int, float)) and int(percent) > shown[0]:
            shown[0] = int(percent)
            update(min(100.0, float(percent)))

    return on_progress


def _retry_crashes_only(task, task_run, state) -> bool:
    try:
        state.result()
    except BaseException as error:  # noqa: BLE001 - the state's own exception, re-raised by result()
        return worth_retrying(error)
    return False


@task(name="train", tags=["gpu"], retries=1, retry_delay_seconds=5, persist_result=True,
      retry_condition_fn=_retry_crashes_only,
      task_run_name="train {config.finetuning.stage}-{config.finetuning.finetuning_type}",
      cache_key_fn=content_key(_train_key, lambda key, config, **_: training_complete(config.output_dir, key)))
def train(config: RunConfig, dataset: dict, reference: dict, run: dict) -> dict:
    """Launch (or resume) training in a subprocess; Prefect retries launch again and the child resumes."""
    logger = get_run_logger()
    progress = create_progress_artifact(progress=0.0, key="training-progress", description="training progress")
    on_progress = whole_percent_steps(lambda percent: update_progress_artifact(progress, percent))
    key = _train_key(config, dataset, reference, run)
    fresh = config.pipeline.refresh_cache and task_run.run_count <= 1  # a retry resumes what the first began
    with ChildLog(logger) as child_log:
        result = train_model(config, dataset, reference, key, run.get("run_id"), run.get("tracking_uri"),
                             on_line=child_log.line, on_progress=on_progress, start_fresh=fresh)
    update_progress_artifact(progress, 100.0)
    record_training(run, config, result)
    return result
