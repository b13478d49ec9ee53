"""Trainer callbacks: the progress log the orchestrator reads, MLflow metrics and checkpoints, the torch profiler,
early stopping."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from transformers import EarlyStoppingCallback, TrainerCallback

from tuneline.runtime.contract import LOG_FILE, METRICS_SPOOL_DIR
from tuneline.train.trainer_log import finite_numbers, log_record, logged_metrics, read_log, truncate_log


class TrainerLogCallback(TrainerCallback):
    """Writes one JSON line per log event to `<output_dir>/trainer_log.jsonl` (main process only), with
    trainer_log.py's keys."""

    def __init__(self, output_dir: str | Path):
        self.path = Path(output_dir) / LOG_FILE
        self.start_time = time.time()
        self.start_step = 0
        self.start_tokens = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.start_time, self.start_step = time.time(), state.global_step
        self.start_tokens = state.num_input_tokens_seen or 0
        if state.is_world_process_zero:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            truncate_log(self.path, state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = log_record(self.progress(state), finite_numbers(logs))
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def progress(self, state) -> dict[str, Any]:
        elapsed = time.time() - self.start_time
        done = state.global_step - self.start_step
        total = state.max_steps or 0
        remaining = elapsed / done * (total - state.global_step) if done > 0 else None
        tokens = state.num_input_tokens_seen or 0
        return {
            "current_steps": state.global_step, "total_steps": total, "epoch": round(state.epoch or 0.0, 4),
            "percentage": round(100.0 * state.global_step / total, 2) if total else None,
            "elapsed_time": round(elapsed, 3), "remaining_time": round(remaining, 3) if remaining is not None
            else None, "total_tokens": tokens,
            "throughput": round((tokens - self.start_tokens) / elapsed, 2) if elapsed > 0 else None,
            "timestamp": round(time.time(), 3), **peak_gpu_memory(),
        }


def peak_gpu_memory() -> dict[str, float]:
    """This process's peak allocated CUDA memory since it started, in MiB, for the GPU check to read; on a machine
    without CUDA (or before anything used it) nothing, so CPU logs keep their keys."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    return {"peak_gpu_memory_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1)}


class MlflowMetricsCallback(TrainerCallback):
    """Streams logged metrics into the flow's MLflow run (main process only), trainer global step as step.

    While MLflow is unreachable the values wait in output_dir's spool. A resumed training first sends the steps its log
    holds up to its checkpoint, which a start killed right after a save had not sent; MLflow gets each step once."""

    def __init__(self, output_dir: str | Path, logger_factory=None):
        self.output_dir = Path(output_dir)
        self.logger_factory = logger_factory or _default_logger_factory
        self.logger = None

    def on_train_begin(self, args, state, control, **kwargs):
        run_id, uri = os.environ.get("MLFLOW_RUN_ID"), os.environ.get("MLFLOW_TRACKING_URI")
        if state.is_world_process_zero and run_id and uri and self.logger is None:
            self.logger = self.logger_factory(run_id, uri, self.output_dir / METRICS_SPOOL_DIR)
            for entry in read_log(self.output_dir / LOG_FILE) if state.global_step else []:
                step, metrics, stamp = entry.get("current_steps"), logged_metrics(entry), entry.get("timestamp")
                if isinstance(step, int) and 0 < step <= state.global_step and metrics:
                    self.logger.log(metrics, step, int(stamp * 1000) if stamp else None)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.logger is not None and logs:
            metrics = finite_numbers(logs)
            if metrics:
                self.logger.log(metrics, step=state.global_step)

    def on_save(self, args, state, control, **kwargs):
        self.flush()

    def flush(self) -> None:
        """Metrics up to a checkpoint reach MLflow before a resume could start from it (they are sent batched)."""
        if self.logger is not None:
            self.logger.flush()

    def close(self) -> None:
        """Called by the stage runner after the final evaluation, so those metrics are sent too."""
        if self.logger is not None:
            self.logger.close()
            self.logger = None


def _default_logger_factory(run_id: str, tracking_uri: str, spool_dir: Path):
    """Sends from a worker thread, batched: the training never waits on a database commit or an HTTP round trip."""
    from tuneline.tracking import BackgroundStepLogger, StepMetricLogger

    return BackgroundStepLogger(lambda: StepMetricLogger(run_id, tracking_uri, spool_dir))


class CurrentSchedule(TrainerCallback):
    """A resumed run logs, evaluates and saves on this config's schedule: transformers restores the checkpoint's
    `logging_steps`, `eval_steps` and `save_steps` with its state, so they are set again from the arguments."""

    def on_train_begin(self, args, state, control, **kwargs):
        state.compute_steps(args, state.max_steps)


def build_callbacks(config, output_dir: str | Path, extra: list | None = None) -> list:
    """The callbacks every stage uses, then the caller's."""
    callbacks = [CurrentSchedule(), TrainerLogCallback(output_dir), MlflowMetricsCallback(output_dir)]
    if config.pipeline.mlflow_log_checkpoints:
        from tuneline.train.mlflow_checkpoints import MlflowCheckpointCallback

        callbacks.append(MlflowCheckpointCallback(output_dir))
    if config.finetuning.enable_torch_profiler:
        from tuneline.train.profiler import TorchProfilerCallback

        callbacks.append(TorchProfilerCallback(config))
    if config.finetuning.early_stopping_steps:
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=config.finetuning.early_stopping_steps))
    return callbacks + list(extra or [])
