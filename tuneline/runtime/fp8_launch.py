"""FP8 training (`fp8`, `fp8_backend`, `fp8_enable_fsdp_float8_all_gather`) as accelerate's launcher sets it up:
`accelerate launch --mixed_precision fp8 --fp8_backend ...` puts it in the training process's environment, where the
Trainer's Accelerator reads it, as LLaMA-Factory 0.9.5 sets ACCELERATE_MIXED_PRECISION=fp8."""

from __future__ import annotations

# LLaMA-Factory's fp8_backend names -> accelerate launch's --fp8_backend ('auto': none given, and accelerate picks
# torchao, then Transformer Engine, then MS-AMP, whichever is installed)
FP8_BACKENDS = {"auto": None, "torchao": "ao", "te": "te", "msamp": "msamp"}


def fp8_launch_flags(config) -> list[str]:
    """`accelerate launch` flags for this run's mixed precision: FP8 with its backend under `fp8`, else none (the
    Trainer's bf16/fp16 autocast follows the weights' dtype)."""
    ft = config.finetuning
    if not ft.fp8:
        return ["--mixed_precision", "no"]
    flags = ["--mixed_precision", "fp8"]
    if FP8_BACKENDS[ft.fp8_backend]:
        flags += ["--fp8_backend", FP8_BACKENDS[ft.fp8_backend]]
    if ft.fp8_enable_fsdp_float8_all_gather:
        flags += ["--fp8_enable_fsdp_float8_all_gather", "true"]
    return flags
