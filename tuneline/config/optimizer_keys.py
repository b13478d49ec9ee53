"""Checks of the keys that choose an optimizer or a precision LLaMA-Factory offers beside AdamW (GaLore, APOLLO,
Adam-mini, Muon, BAdam, LoRA+, pure_bf16), with LLaMA-Factory's rules said as tuneline's messages."""

from __future__ import annotations

import os

from tuneline.config.run_config import RunConfig
from tuneline.runtime.deepspeed_setup import read_ds_config

OPTIMIZER_KEYS = ("use_galore", "use_apollo", "loraplus_lr_ratio", "use_badam", "use_adam_mini", "use_muon")
# `optim` (LLaMA-Factory's base optimizer) -> transformers' GaLore / APOLLO optimizer of that kind.
LOW_RANK_OPTIMS = {
    "galore": {"adamw_torch": "galore_adamw", "adamw_torch_fused": "galore_adamw", "adamw_8bit": "galore_adamw_8bit",
               "adamw_bnb_8bit": "galore_adamw_8bit", "paged_adamw_8bit": "galore_adamw_8bit",
               "adafactor": "galore_adafactor"},
    "apollo": {"adamw_torch": "apollo_adamw", "adamw_torch_fused": "apollo_adamw"},
}


def low_rank_optim_name(method: str, optim) -> str:
    """transformers' optimizer name for GaLore / APOLLO over the base `optim` (unset: AdamW)."""
    base = str(getattr(optim, "value", optim) or "adamw_torch")
    if base not in LOW_RANK_OPTIMS[method]:
        raise ValueError(f"'use_{method}: true' with 'optim: {base}': {method} builds on "
                         f"{', '.join(sorted(LOW_RANK_OPTIMS[method]))}; set one of those, or leave 'optim' unset")
    return LOW_RANK_OPTIMS[method][base]


def optimizer_problems(config: RunConfig, world_size: int | None = None) -> list[str]:
    """One optimizer key at most; GaLore / APOLLO on full or freeze training without DeepSpeed; their layerwise
    kind in one process with `gradient_accumulation_steps: 1`; pure_bf16 without fp16 or ZeRO-3."""
    ft, tr, problems = config.finetuning, config.training, []
    chosen = [key for key in OPTIMIZER_KEYS if getattr(ft, key)]
    if len(chosen) > 1:
        problems.append(f"{' and '.join(repr(key) for key in chosen)} each choose the optimizer; keep one")
    deepspeed = tr.get("deepspeed")
    for method in ("galore", "apollo"):
        if not getattr(ft, f"use_{method}"):
            continue
        if ft.finetuning_type in ("lora", "oft"):
            problems.append(f"'use_{method}: true' projects the gradients of full weights; with 'finetuning_type: "
                            f"{ft.finetuning_type}' use 'finetuning_type: full' or 'freeze'")
        if deepspeed:
            problems.append(f"'use_{method}: true' does not run under DeepSpeed (as in LLaMA-Factory); remove "
                            f"'deepspeed: {deepspeed}'")
        try:
            low_rank_optim_name(method, tr.get("optim"))
        except ValueError as exc:
            problems.append(str(exc))
        if getattr(ft, f"{method}_layerwise"):
            problems += _layerwise_problems(config, method, world_size)
    if ft.use_muon and deepspeed and zero_stage(deepspeed):
        problems.append(f"'use_muon: true' orthogonalizes whole 2-D weights, which DeepSpeed ZeRO-{zero_stage(deepspeed)} "
                        "hands to the optimizer as flat partitions; remove 'deepspeed' (or use ZeRO-0)")
    if ft.pure_bf16:
        if tr.get("fp16"):
            problems.append("'pure_bf16: true' trains in bf16; it conflicts with 'fp16: true': remove one")
        if deepspeed and zero_stage(deepspeed) == 3:
            problems.append("'pure_bf16: true' does not run under DeepSpeed ZeRO-3, which keeps fp32 weights of its "
                            "own (as in LLaMA-Factory); use ZeRO-2 or no 'deepspeed'")
    if ft.stage == "ppo":
        problems += [f"'{key}' is not supported by 'stage: ppo': its training loop builds a plain optimizer; remove it"
                     for key in chosen if key not in ("loraplus_lr_ratio", "use_badam")]  # ppo_keys says those
    return problems


def _layerwise_problems(config: RunConfig, method: str, world_size: int | None) -> list[str]:
    problems = []
    accumulation = int(config.training.get("gradient_accumulation_steps") or 1)
    if accumulation != 1:
        problems.append(f"'{method}_layerwise: true' updates each weight as soon as its gradient is ready, so it "
                        f"cannot accumulate gradients: set 'gradient_accumulation_steps: 1' (got {accumulation})")
    processes = world_size or int(os.environ.get("WORLD_SIZE", "0")) or config.pipeline.num_processes or 1
    if processes > 1 or config.pipeline.num_machines > 1:
        problems.append(f"'{method}_layerwise: true' runs in one process (as in LLaMA-Factory); set "
                        f"'{method}_layerwise: false' to train in {processes} processes, or 'num_processes: 1'")
    return problems


def zero_stage(deepspeed) -> int:
    """ZeRO stage of the `deepspeed` config (a dict or a JSON file); 0 without DeepSpeed, or with a config that cannot
    be read (preflight refuses that one)."""
    ds_config, _ = read_ds_config(deepspeed) if deepspeed else ({}, None)
    zero = ds_config.get("zero_optimization") or {}
    return int(zero.get("stage", 0) or 0) if isinstance(zero, dict) else 0
