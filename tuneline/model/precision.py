"""Which dtype and quantization a model loads with, decided from the config and the device.

The device decides the default (bf16 where the GPU supports it, fp16 on older GPUs, fp32 on CPU) so one config
runs on a laptop and a cluster; `bf16` / `fp16` in the config override it.
"""

from __future__ import annotations

import os

from tuneline.config import RunConfig
from tuneline.errors import ConfigError, UserError
from tuneline.runtime.requirements import quantization_problem

PRECISION_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
INFER_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def training_precision(config: RunConfig) -> str:
    """'bf16', 'fp16' or 'fp32': what the run computes in. Trainers set TrainingArguments' bf16/fp16 from it."""
    tr = config.training
    if tr.get("bf16"):
        return "bf16"
    if tr.get("fp16"):
        return "fp16"
    if "bf16" in tr or "fp16" in tr or trains_on_cpu(config):
        return "fp32"  # an explicit `bf16: false` / `fp16: false` means full precision
    import torch

    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def compute_dtype(config: RunConfig, is_trainable: bool = True):
    """torch dtype of the loaded weights; `infer_dtype` decides for inference when it is not 'auto'; `pure_bf16`
    trains in bf16 whatever the device (weights, gradients and optimizer state, as LLaMA-Factory does)."""
    import torch

    if is_trainable and config.finetuning.pure_bf16:
        return torch.bfloat16
    precision = training_precision(config)
    if not is_trainable and config.model.infer_dtype != "auto":
        precision = INFER_DTYPES[config.model.infer_dtype]
    return getattr(torch, PRECISION_DTYPES[precision])


def trains_on_cpu(config: RunConfig) -> bool:
    """`use_cpu` set, or no CUDA device visible."""
    return bool(config.training.get("use_cpu")) or not _cuda_available()


def quantization_kwargs(config: RunConfig, dtype) -> dict:
    """BitsAndBytesConfig and device placement for QLoRA; {} when `quantization_bit` is unset."""
    bits = config.model.quantization_bit
    if bits is None:
        return {}
    if config.finetuning.finetuning_type != "lora":
        raise ConfigError(f"'quantization_bit: {bits}' trains only LoRA adapters; it conflicts with "
                          f"'finetuning_type: {config.finetuning.finetuning_type}'")
    if problem := quantization_problem("quantization_bit", bits, _cuda_available()):
        raise UserError(problem)
    from transformers import BitsAndBytesConfig

    if bits == 8:
        quant = BitsAndBytesConfig(load_in_8bit=True)
    else:
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtype,
                                   bnb_4bit_use_double_quant=config.model.double_quantization,
                                   bnb_4bit_quant_type=config.model.quantization_type, bnb_4bit_quant_storage=dtype)
    # Quantized weights cannot be moved after loading: put them on this process's GPU now.
    return {"quantization_config": quant, "device_map": {"": int(os.environ.get("LOCAL_RANK", "0"))}}
