"""What a config needs from the machine and its installed packages, said the same way wherever it is checked:
before anything starts (on the machine that starts the run) and where a model loads (on the one that trains)."""

from __future__ import annotations

import importlib.util

from tuneline.runtime.deepspeed_setup import deepspeed_problems
from tuneline.runtime.fsdp_setup import fsdp_problem


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def quantization_problem(key: str, bits: int | None, cuda: bool) -> str | None:
    if bits is None:
        return None
    if not cuda:
        return (f"'{key}: {bits}' quantizes through bitsandbytes, which needs a CUDA GPU, and none is visible here; "
                f"remove '{key}' to train in full precision")
    if not installed("bitsandbytes"):
        return f"'{key}: {bits}' needs the bitsandbytes package: `pip install bitsandbytes`"
    return None


def attention_problem(name: str, cuda: bool) -> str | None:
    """Why `attn_implementation: name` cannot run here, or None."""
    if name == "flex_attention" and not cuda:
        return "'attn_implementation: flex_attention' needs a CUDA GPU and none is visible; use 'sdpa'"
    if name != "flash_attention_2":
        return None
    if not installed("flash_attn"):
        return ("'attn_implementation: flash_attention_2' (or 'flash_attn: fa2') needs the flash-attn package, which "
                "is not installed: `pip install flash-attn`, or use 'sdpa'")
    if not cuda:
        return "'attn_implementation: flash_attention_2' needs a CUDA GPU and none is visible; use 'sdpa'"
    return None


def liger_problem(enabled: bool, cuda: bool) -> str | None:
    if not enabled:
        return None
    if not cuda:
        return ("'enable_liger_kernel: true' runs liger-kernel's Triton kernels, which run on a CUDA GPU only, and none "
                "is visible here; remove it (on the CPU transformers' own kernels train the model)")
    if not installed("liger_kernel"):
        return "'enable_liger_kernel: true' needs the liger-kernel package: `pip install -e '.[liger]'`"
    return None


# fp8_backend -> the modules that provide it
FP8_PACKAGES = {"torchao": ("torchao",), "te": ("transformer_engine",), "msamp": ("msamp",),
                "auto": ("torchao", "transformer_engine", "msamp")}


def fp8_problem(ft, cuda: bool) -> str | None:
    if not ft.fp8:
        return None
    if not cuda:
        return ("'fp8: true' trains with FP8 matrix multiplies, which need a CUDA GPU with FP8 tensor cores (Ada, "
                "Hopper or newer), and none is visible here; remove it, or use 'bf16: true'")
    if not any(installed(module) for module in FP8_PACKAGES[ft.fp8_backend]):
        return (f"'fp8: true' with 'fp8_backend: {ft.fp8_backend}' needs "
                + ("torchao, Transformer Engine or MS-AMP" if ft.fp8_backend == "auto" else ft.fp8_backend)
                + " installed: `pip install -e '.[fp8]'` (torchao, one of accelerate's FP8 backends)")
    return None


# finetuning key -> (modules it imports, comma-separated; the pip package; tuneline's extra that installs it)
OPTIMIZER_PACKAGES = {
    "use_badam": ("badam", "badam", "badam"),
    "use_galore": ("galore_torch,bitsandbytes", "galore-torch", "galore"),  # galore_torch imports bitsandbytes
    "use_apollo": ("apollo_torch,bitsandbytes", "apollo-torch", "apollo"),
    "use_adam_mini": ("adam_mini", "adam-mini", "adam-mini"),
}


def missing_requirements(config, cuda: bool) -> list[str]:
    """Every package or device this config needs and this machine lacks; `cuda`: whether training gets a GPU."""
    problems = [quantization_problem("quantization_bit", config.model.quantization_bit, cuda),
                quantization_problem("ref_model_quantization_bit", config.finetuning.ref_model_quantization_bit, cuda)]
    problems.append(attention_problem(config.model.attn_implementation, cuda))
    if config.training.get("fp16") and not cuda:
        problems.append("'fp16: true' needs a CUDA GPU and none is visible; on CPU use 'bf16: true' or neither")
    problems += deepspeed_problems(config.training.get("deepspeed"))
    problems.append(fsdp_problem(config.training, config.pipeline.accelerate_config, cuda))
    problems += [liger_problem(config.model.enable_liger_kernel, cuda), fp8_problem(config.finetuning, cuda)]
    problems += [f"'{key}: true' needs the {package} package: `pip install -e '.[{extra}]'` (or `pip install "
                 f"{package}`)" for key, (module, package, extra) in OPTIMIZER_PACKAGES.items()
                 if getattr(config.finetuning, key) and not all(installed(name) for name in module.split(","))]
    return [problem for problem in problems if problem]
