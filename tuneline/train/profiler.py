"""The torch profiler around training steps (LLaMA-Factory's `enable_torch_profiler` and `profiler_*` keys).

Traces are written per cycle, in the format TensorBoard's profiler plugin and Perfetto read, under
`profiler_output_dir` (default `<output_dir>/profiler`); the main process logs them to the flow's MLflow run under
`profiler/` when training ends, so they sit beside the metrics of the steps they timed."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from transformers import TrainerCallback

log = logging.getLogger(__name__)
ARTIFACT_PATH = "profiler"


def profiler_dir(config) -> Path:
    return Path(config.finetuning.profiler_output_dir or Path(config.training["output_dir"]) / "profiler")


class TorchProfilerCallback(TrainerCallback):
    """Starts the profiler when training begins, advances its schedule after each optimizer step, stops it (writing
    any open cycle) when training ends."""

    def __init__(self, config):
        self.config, self.directory, self.profiler = config, profiler_dir(config), None

    def on_train_begin(self, args, state, control, **kwargs):
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        ft = self.config.finetuning
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.directory.mkdir(parents=True, exist_ok=True)
        self.profiler = profile(
            activities=activities,
            schedule=schedule(wait=ft.profiler_wait_steps, warmup=ft.profiler_warmup_steps,
                              active=ft.profiler_active_steps, repeat=ft.profiler_repeat),
            on_trace_ready=tensorboard_trace_handler(str(self.directory), worker_name=f"rank{args.process_index}"),
            record_shapes=ft.profiler_record_shapes, profile_memory=ft.profiler_profile_memory,
            with_stack=ft.profiler_with_stack)
        self.profiler.start()

    def on_step_end(self, args, state, control, **kwargs):
        if self.profiler is not None:
            self.profiler.step()

    def on_train_end(self, args, state, control, **kwargs):
        if self.profiler is None:
            return
        self.profiler.stop()
        self.profiler = None
        run_id, uri = os.environ.get("MLFLOW_RUN_ID"), os.environ.get("MLFLOW_TRACKING_URI")
        traces = sorted(self.directory.glob("*.pt.trace.json*"))
        if not traces:
            log.warning("the torch profiler wrote no trace: training ran fewer steps than 'profiler_wait_steps' + "
                        "'profiler_warmup_steps' + 'profiler_active_steps'")
        if state.is_world_process_zero and run_id and uri and traces:
            from tuneline.tracking import log_artifacts

            log_artifacts(run_id, self.directory, ARTIFACT_PATH, tracking_uri=uri)
