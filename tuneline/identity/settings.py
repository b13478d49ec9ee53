"""The one list of settings that do not shape a training's weights, in the two kinds a key tells apart.

- NOT_CONTENT: in no key at all (where results are tracked, how a run is named, cache control, which machine).
- COSMETIC_KEYS (and EVAL_SCHEDULE_KEYS, unless an evaluation decides the weights): how a run is watched or
  stored. They are part of the exact train key (a run that logs or saves otherwise is another run) but not of the
  resume key, so a checkpoint resumes across them and a finished training stands for them.
"""

from __future__ import annotations

from tuneline.config.training_keys import PUBLISH_KEYS

# Keys that never change what a step produces: where results are tracked, how a run is named, cache control.
NOT_CONTENT = {
    "run_name", "refresh_cache", "discard_checkpoints", "overwrite_cache", "mlflow_tracking_uri", "mlflow_experiment",
    "mlflow_registered_model", "mlflow_log_checkpoints", "report_to", "logging_dir", "hf_hub_token",
    "resume_from_checkpoint", "overwrite_output_dir", "preprocessing_num_workers", "disable_tqdm",
    "disable_gradient_checkpointing", "use_reentrant_gc",  # recomputes the same activations: same weights
    "machine_rank", "main_process_ip", "main_process_port",  # which machine, and where they meet: the same training
} | PUBLISH_KEYS  # where the result is published, after training (the model card's key has them)
EVAL_ONLY = {"eval_max_samples", "eval_max_new_tokens", "pipeline_cache_dir"}


# Keys that change how a run is watched or stored, not the weights it ends with.
COSMETIC_KEYS = frozenset({
    "output_dir", "overwrite_output_dir", "resume_from_checkpoint", "logging_dir", "logging_steps",
    "logging_strategy", "logging_first_step", "logging_nan_inf_filter", "log_level", "log_level_replica",
    "log_on_each_node", "disable_tqdm", "report_to", "run_name", "project", "save_steps", "save_strategy",
    "save_total_limit", "save_on_each_node", "save_safetensors", "save_only_model", "push_to_hub", "hub_token",
    "hub_model_id", "hub_strategy", "hub_private_repo", "hub_always_push", "hub_revision", "dataloader_num_workers",
    "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor", "skip_memory_metrics",
    "include_num_input_tokens_seen", "hf_hub_token", "cache_dir", "export_dir", "export_size", "export_device",
    "export_legacy_format", "plot_loss", "include_effective_tokens_per_second", "per_device_eval_batch_size",
    "eval_accumulation_steps", "ddp_timeout", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id",
    "discard_checkpoints", "use_kv_cache", "enable_torch_profiler", "profiler_output_dir", "profiler_wait_steps",
    "profiler_warmup_steps", "profiler_active_steps", "profiler_repeat", "profiler_record_shapes",
    "profiler_profile_memory", "profiler_with_stack",
})
# When evaluations run: cosmetic too, unless an evaluation decides the weights (best model, early stopping).
EVAL_SCHEDULE_KEYS = frozenset({"eval_steps", "eval_strategy", "eval_delay", "eval_on_start", "eval_do_concat_batches"})


def weight_neutral_keys(config) -> frozenset[str]:
    """Keys a checkpoint can be resumed across: they change how a run is watched or stored, not its weights."""
    decides = config.training.get("load_best_model_at_end") or config.finetuning.early_stopping_steps
    return COSMETIC_KEYS if decides else COSMETIC_KEYS | EVAL_SCHEDULE_KEYS
