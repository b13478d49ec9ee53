"""liger-kernel (`enable_liger_kernel`) and FP8 training (`fp8`, `fp8_backend`, `fp8_enable_fsdp_float8_all_gather`),
both handed to the libraries that own them through their public switches: transformers' `use_liger_kernel` (the
Trainer patches the model instance with liger's kernels for its model type) and accelerate's launcher
(`accelerate launch --mixed_precision fp8 --fp8_backend ...`, tuneline.runtime.fp8_launch; the Trainer's Accelerator reads
the environment it sets).

Both need a CUDA GPU; tuneline.runtime.requirements refuses them before a run starts where there is none."""

from __future__ import annotations

import os
from typing import Any


def needs_logits(config) -> bool:
    """Whether training reads the logits themselves: every stage but pt and sft (as LLaMA-Factory has it), and sft
    with a loss of its own (DFT, EAFT, ASFT). liger's fused linear cross-entropy never makes them, so there it is
    swapped for liger's plain cross-entropy kernel."""
    ft = config.finetuning
    return config.stage not in ("pt", "sft") or ft.use_dft_loss or ft.use_eaft_loss or ft.use_asft_loss


def liger_arguments(config) -> dict[str, Any]:
    """The TrainingArguments that apply liger-kernel as LLaMA-Factory does (RoPE, RMSNorm, SwiGLU and fused linear
    cross-entropy, or cross-entropy alone where the logits are read); {} without `enable_liger_kernel`."""
    if not config.model.enable_liger_kernel:
        return {}
    kernels = dict(config.training.get("liger_kernel_config") or {})
    if needs_logits(config):
        kernels.update(fused_linear_cross_entropy=False, cross_entropy=True)
    return {"use_liger_kernel": True, "liger_kernel_config": kernels or None}


def apply_liger_and_fp8(kwargs: dict[str, Any], config) -> dict[str, Any]:
    """TrainingArguments keyword arguments with liger's switches added; under `fp8` bf16/fp16 autocast is left to
    accelerate's FP8 (transformers would otherwise ask it for bf16), which the launch must have set."""
    from tuneline.errors import ConfigError

    kwargs.update(liger_arguments(config))
    if config.finetuning.fp8:
        if os.environ.get("ACCELERATE_MIXED_PRECISION") != "fp8":
            raise ConfigError("'fp8: true' is set up by the launcher: start the training with `tuneline train`, or "
                              "`accelerate launch --mixed_precision fp8`", source=config.source)
        kwargs["bf16"] = kwargs["fp16"] = False
    return kwargs
