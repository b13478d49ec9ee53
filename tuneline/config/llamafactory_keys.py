"""LLaMA-Factory options tuneline does not run, each with the value that means "off" and what to do instead.

A YAML written for LLaMA-Factory may carry any key of its argument classes; the ones here ask for a backend, a
command or a logger tuneline does not have. Set to their off value they change nothing and pass; set otherwise they
are refused, all in one message, so that a user reads every one at once (never "unknown key")."""

from __future__ import annotations

from tuneline.config.args import GROUPS

_EVAL = ("it belongs to `llamafactory-cli eval` (MMLU, CMMLU, C-Eval benchmarks), which tuneline does not run; "
         "tuneline evaluates on your validation split ('val_size', 'eval_dataset') and scores generated answers "
         "(`evaluate` step)")
_SERVING = ("it configures a serving engine of LLaMA-Factory's chat API; tuneline serves a trained model with "
            "`tuneline api`, whose engine 'infer_backend' chooses")
_SWANLAB = "it configures SwanLab; tuneline records every run in MLflow ('mlflow_tracking_uri', 'mlflow_experiment')"
_KTRANSFORMERS = "it configures KTransformers (CPU/GPU hybrid MoE training), which tuneline does not run"
_EXPORT_QUANT = ("it quantizes the export with GPTQ; `tuneline export` writes the merged model in full precision: "
                 "quantize it afterwards with your serving stack's tool")

# key -> (the value that means off, why it is refused and what to do instead)
_REFUSED: dict[str, tuple[object, str]] = {
    **dict.fromkeys(("task", "task_dir", "batch_size", "lang", "n_shot", "save_dir", "download_mode"), (None, _EVAL)),
    **{key: (None, _SERVING) for key in ("vllm_maxlen", "vllm_gpu_util", "vllm_max_lora_rank", "vllm_config",
                                          "sglang_maxlen", "sglang_mem_fraction", "sglang_tp_size", "sglang_config",
                                          "sglang_lora_backend")},
    "vllm_enforce_eager": (False, _SERVING),
    **{key: (None, _SWANLAB) for key in ("swanlab_project", "swanlab_workspace", "swanlab_run_name", "swanlab_api_key",
                                         "swanlab_lark_webhook_url", "swanlab_lark_secret", "swanlab_logdir")},
    "swanlab_mode": ("cloud", _SWANLAB),
    "use_kt": (False, _KTRANSFORMERS),
    **{key: (None, _KTRANSFORMERS) for key in ("kt_weight_path", "kt_expert_checkpoint_path",
                                               "kt_lora_expert_num", "kt_lora_expert_intermediate_size")},
    "kt_use_lora_experts": (False, _KTRANSFORMERS),
    **{key: (None, _EXPORT_QUANT) for key in ("export_quantization_dataset", "export_quantization_nsamples",
                                              "export_quantization_maxlen")},
    "use_mca": (False, "it trains through Megatron-Core (mcore_adapter); tuneline scales out with accelerate: "
                       "'num_processes', DeepSpeed ZeRO ('deepspeed') or FSDP ('accelerate_config')"),
    **dict.fromkeys(("use_hyper_parallel", "use_v1_kernels"),
                    (False, "it switches to LLaMA-Factory's experimental v1 engine; tuneline trains with "
                            "transformers' Trainer ('enable_liger_kernel' for fused kernels)")),
    "hyper_parallel_args": (None, "it configures LLaMA-Factory's v1 hyper-parallel engine, which tuneline does not "
                                  "run"),
    "audio_sampling_rate": (16000, "tuneline trains text and image/video models, not audio ones"),
    "reward_model_quantization_bit": (None, "the PPO reward model loads in the training precision; remove it, or "
                                            "train a smaller reward model"),
    "profile_modules": (None, "per-module timings come from the torch profiler's trace: set "
                              "'enable_torch_profiler: true' and read the module rows of its trace"),
    # LLaMA-Factory derives these from other keys, and its own parser refuses them in a YAML
    "block_diag_attn": (False, "packed examples never attend to each other in tuneline: 'packing: true' or "
                               "'neat_packing: true' is what asks for packing"),
    "compute_dtype": (None, "the compute precision follows 'bf16', 'fp16' or 'pure_bf16'"),
    "device_map": (None, "the launcher places the model: one process per GPU ('num_processes'), DeepSpeed or FSDP "
                         "to shard it"),

    # until the templates keep earlier turns' reasoning on request
    "preserve_thinking": (False, "tuneline's templates drop the reasoning of earlier assistant turns, as the models' "
                                 "own chat templates do"),
}
# A key that one of tuneline's argument groups holds is honoured there, and never refused here.
_HONOURED = {name for group in GROUPS.values() for name in group.__dataclass_fields__}
REFUSED = {key: rule for key, rule in _REFUSED.items() if key not in _HONOURED}


def refused_problems(found: dict[str, object], why: dict[str, str]) -> list[str]:
    """One problem naming every refused LLaMA-Factory option set (key -> value) with `why` (key -> reason)."""
    if len(found) == 1:
        [(key, value)] = found.items()
        return [f"'{key}: {value}' is a LLaMA-Factory option tuneline does not support ({why[key]}); remove it"]
    named = "; ".join(f"'{key}: {value}' ({why[key]})" for key, value in found.items())
    return [f"{len(found)} LLaMA-Factory options tuneline does not support are set; remove them: {named}"] if found else []
