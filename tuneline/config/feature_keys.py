"""Checks of LLaMA-Factory's feature switches that need more than one key: the sft losses (one at a time), the new
tokens and how their embeddings start, the longest sequence, and what PPO's own loop cannot run. Each returns
problems, never raises."""

from __future__ import annotations

from pathlib import Path

import yaml

from tuneline.config.optimizer_keys import zero_stage
from tuneline.config.run_config import RunConfig

SFT_LOSSES = ("use_dft_loss", "use_eaft_loss", "use_asft_loss")


def feature_problems(config: RunConfig) -> list[str]:
    ft, model, problems = config.finetuning, config.model, []
    chosen = [key for key in SFT_LOSSES if getattr(ft, key)]
    if len(chosen) > 1:
        problems.append(f"{' and '.join(f'{key!r}' for key in chosen)} each choose the sft loss; keep one")
    if ft.use_asft_loss and zero_stage(config.training.get("deepspeed")) == 3:
        problems.append("'use_asft_loss: true' keeps a frozen copy of the model as its reference, which DeepSpeed "
                        "ZeRO-3's partitioned weights cannot give; use a ZeRO-2 'deepspeed' config (or none)")
    if model.init_special_tokens != "noise_init" and not model.new_special_tokens_config:
        problems.append(f"'init_special_tokens: {model.init_special_tokens}' starts each new token's embedding from "
                        "its description, and there are none: set 'new_special_tokens_config' (a YAML file of "
                        "token: description), or use 'init_special_tokens: noise_init'")
    if model.new_special_tokens_config and model.add_special_tokens:
        problems.append("'new_special_tokens_config' and 'add_special_tokens' both name the special tokens to add; "
                        "keep one (the file's tokens, with their descriptions, or the list)")
    problems += token_description_problems(model.new_special_tokens_config)
    if model.model_max_length is not None and config.data.cutoff_len > model.model_max_length:
        problems.append(f"'cutoff_len: {config.data.cutoff_len}' is above 'model_max_length: "
                        f"{model.model_max_length}', the longest sequence the model takes; lower 'cutoff_len' or "
                        "raise 'model_max_length'")
    if config.stage == "ppo":
        problems += [f"'{key}: true' is not run by 'stage: ppo', whose loop is tuneline's own rather than the "
                     "Trainer's; remove it" for key, on in (("enable_liger_kernel", model.enable_liger_kernel),
                                                             ("fp8", ft.fp8)) if on]
    return problems


def token_descriptions(path: str | None) -> dict[str, str]:
    """The new special tokens and their descriptions, in the file's order ({} without a file)."""
    if not path:
        return {}
    data = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8")) or {}
    return {str(token): str(text) for token, text in data.items()}


def token_description_problems(path: str | None) -> list[str]:
    if not path:
        return []
    where = f"'new_special_tokens_config' ({path})"
    try:
        data = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except OSError as exc:
        return [f"{where} cannot be read: {exc.strerror or exc}"]
    except yaml.YAMLError as exc:
        return [f"{where} is not valid YAML: {exc}"]
    if not isinstance(data, dict) or not data or not all(isinstance(v, str) and v.strip() for v in data.values()):
        return [f"{where} must map each new special token to a description, e.g. '<|start_svg|>: Marks the start of "
                "an SVG document'"]
    return []
