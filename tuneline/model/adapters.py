"""peft adapters: load (and merge) existing ones, or attach a new LoRA or OFT one from the lora_* / oft_* keys.

Without `create_new_adapter`, all adapters but the last are merged and the last keeps training. A quantized base
cannot absorb merges, so it takes exactly one adapter."""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

from tuneline.config import RunConfig
from tuneline.config.args import ADAPTER_TYPES
from tuneline.config.run_config import split_names
from tuneline.config.validate import check_model_path
from tuneline.errors import ConfigError, UserError, did_you_mean
from tuneline.model.new_tokens import grows_vocab
from tuneline.model.vision import composite_parts, frozen_parts, in_part

logger = logging.getLogger("tuneline")

# Output layers score tokens or sequences; adapting them is what `additional_target` is for, never 'all'.
OUTPUT_LAYER_NAMES = frozenset({"lm_head", "score", "classifier", "v_head", "output_layer"})
LINEAR_CLASS_NAMES = frozenset({"Linear4bit", "Linear8bitLt", "Conv1D"})


def check_adapter_paths(paths: list[str]) -> list[str]:
    """Each adapter must be a local folder holding adapter_config.json, or a hub id."""
    problems = []
    for path in paths:
        problems += check_model_path(path, "adapter_name_or_path")
        if Path(path).expanduser().is_dir() and not (Path(path).expanduser() / "adapter_config.json").is_file():
            problems.append(f"'adapter_name_or_path' entry '{path}' is not a LoRA adapter folder: it has no "
                            "adapter_config.json (a fully trained model goes in 'model_name_or_path' instead)")
    return problems


def load_adapter(model, path: str, is_trainable: bool):
    """PeftModel of `model` with the adapter at `path`; a clear error when it was trained on another model."""
    from peft import PeftModel

    try:
        with _without_peft_deprecation_notice():
            return PeftModel.from_pretrained(model, path, is_trainable=is_trainable)
    except (RuntimeError, ValueError, KeyError) as exc:
        trained_on = _adapter_base_name(path)
        detail = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise UserError(
            f"adapter '{path}' does not fit the base model '{model.name_or_path}'"
            + (f" (it was trained on '{trained_on}')" if trained_on else "")
            + f": {detail}. Load it on the model it was trained on ('model_name_or_path'), or drop it from "
            "'adapter_name_or_path'"
        ) from None


@contextlib.contextmanager
def _without_peft_deprecation_notice() -> Iterator[None]:
    """peft 0.21 reads transformers 5's deprecated `is_gradient_checkpointing` when it wraps a model: the
    FutureWarning (a traceback-like pair of lines in every LoRA run's log) is for peft's authors, not our users."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def _adapter_base_name(path: str) -> str | None:
    config_file = Path(path) / "adapter_config.json"
    try:
        return json.loads(config_file.read_text()).get("base_model_name_or_path")
    except (OSError, json.JSONDecodeError):
        return None


def attach_adapters(model, config: RunConfig, adapters: list[str], is_trainable: bool):
    """Merge and/or load `adapters`; returns (model, whether the last adapter stays attached to keep training)."""
    if not adapters:
        return model, False
    quantized = config.model.quantization_bit is not None
    if quantized and len(adapters) > 1:
        raise ConfigError(f"a quantized model ('quantization_bit: {config.model.quantization_bit}') cannot merge "
                          f"adapters, so it takes one adapter; 'adapter_name_or_path' lists {len(adapters)}")
    keeps_last = config.finetuning.finetuning_type in ADAPTER_TYPES and (
        (is_trainable and not config.finetuning.create_new_adapter) or quantized)
    to_merge = adapters[:-1] if keeps_last else adapters
    for path in to_merge:
        model = load_adapter(model, path, is_trainable=False).merge_and_unload()
    if to_merge:
        logger.info("merged %d adapter(s) into the base model: %s", len(to_merge), ", ".join(to_merge))
    if keeps_last:
        model = load_adapter(model, adapters[-1], is_trainable=is_trainable)
        logger.info("loaded adapter %s (%s)", adapters[-1], "training it further" if is_trainable else "unmerged")
    return model, keeps_last


def linear_module_names(model) -> set[str]:
    """Leaf names of every linear layer except the output layers: what `lora_target: all` adapts."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = set()
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if module is output or leaf in OUTPUT_LAYER_NAMES:
            continue
        if _is_linear(module):
            names.add(leaf)
    return names


def _is_linear(module) -> bool:
    import torch

    return isinstance(module, torch.nn.Linear) or type(module).__name__ in LINEAR_CLASS_NAMES


def _check_module_names(model, key: str, names: list[str]) -> None:
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name}
    problems = [f"'{key}' names '{n}', which is no module of this {model.config.model_type} model"
                f"{did_you_mean(n, leaves)}" for n in names if n not in leaves]
    if problems:
        raise ConfigError(problems + [f"linear modules of this model: {', '.join(sorted(linear_module_names(model)))}"])


def _embedding_module_names(model) -> list[str]:
    embeddings = [model.get_input_embeddings(), model.get_output_embeddings()]
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if name and any(module is e for e in embeddings if e is not None)})


def vision_lora_targets(model, config: RunConfig, leaves: set[str], linear_only: bool) -> list[str]:
    """Full names of the modules named `leaves` outside the frozen parts and the projector (LLaMA-Factory's
    `patch_target_modules`); full names, so a vision tower's q_proj is told apart from the language model's.
    `linear_only` for 'all': Qwen's merger has Linear layers named '0' and '2', which decoder layers are named too."""
    parts = composite_parts(model.config)
    excluded = frozen_parts(model.config, config) + parts.projector + parts.lora_conflicts
    targets = sorted(name for name, module in model.named_modules()
                     if name and name.rsplit(".", 1)[-1] in leaves and not in_part(name, excluded)
                     and (_is_linear(module) or not linear_only))
    if not targets:
        raise ConfigError(f"'lora_target: {config.finetuning.lora_target}' adapts no module of this "
                          f"{model.config.model_type} model outside the parts kept frozen ("
                          f"{', '.join(frozen_parts(model.config, config)) or 'none'}); unfreeze one with "
                          "'freeze_vision_tower: false' or 'freeze_language_model: false', or name other modules")
    return targets


def _vision_modules_to_save(model, config: RunConfig) -> list[str]:
    """An unfrozen projector trains whole and is saved beside the adapter (some, like Gemma 3's, hold no Linear
    layer LoRA could adapt; LLaMA-Factory's 'all' never adapts a projector, which leaves the key doing nothing)."""
    parts = composite_parts(model.config)
    return list(parts.projector) if parts and not config.finetuning.freeze_multi_modal_projector else []


def _target_modules(model, config: RunConfig, key: str) -> list[str]:
    """The modules `lora_target` / `oft_target` names: 'all' is every linear layer but the output layers; on a
    vision-language model, full names outside the parts kept frozen."""
    names = split_names(getattr(config.finetuning, key))
    if names == ["all"]:
        targets = sorted(linear_module_names(model))
    else:
        _check_module_names(model, key, names)
        targets = names
    if composite_parts(model.config):
        targets = vision_lora_targets(model, config, set(targets), linear_only=names == ["all"])
    return targets


def _modules_to_save(model, config: RunConfig) -> list[str] | None:
    """`additional_target`, the embeddings when new tokens need rows, and an unfrozen projector."""
    extra = split_names(config.finetuning.additional_target)
    _check_module_names(model, "additional_target", extra)
    if not extra and grows_vocab(config.model):
        extra = _embedding_module_names(model)  # the new token rows must train and be saved with the adapter
    extra += _vision_modules_to_save(model, config)
    return extra or None


def oft_config(model, config: RunConfig, add_valuehead: bool):
    """peft OFTConfig from the oft_* keys, as LLaMA-Factory builds it (rank or block size, one of them 0)."""
    from peft import OFTConfig, TaskType

    ft = config.finetuning
    return OFTConfig(task_type=TaskType.SEQ_CLS if add_valuehead else TaskType.CAUSAL_LM, r=ft.oft_rank,
                     oft_block_size=ft.oft_block_size, target_modules=_target_modules(model, config, "oft_target"),
                     module_dropout=ft.module_dropout, modules_to_save=_modules_to_save(model, config))


def lora_config(model, config: RunConfig, add_valuehead: bool):
    """peft LoraConfig from the lora_* keys (and, on a vision-language model, the freeze_* keys)."""
    from peft import LoraConfig, TaskType

    ft = config.finetuning
    targets = _target_modules(model, config, "lora_target")
    init: bool | str = True
    if ft.pissa_init:
        init = "pissa" if ft.pissa_iter == -1 else f"pissa_niter_{ft.pissa_iter}"
    return LoraConfig(
        task_type=TaskType.SEQ_CLS if add_valuehead else TaskType.CAUSAL_LM,
        r=ft.lora_rank, lora_alpha=ft.lora_alpha or 2 * ft.lora_rank, lora_dropout=ft.lora_dropout,
        target_modules=targets, modules_to_save=_modules_to_save(model, config),
        use_rslora=ft.use_rslora, use_dora=ft.use_dora, init_lora_weights=init,
    )


def add_adapter(model, config: RunConfig, add_valuehead: bool):
    """A fresh trainable LoRA or OFT adapter, its initialisation seeded so that a resumed run rebuilds the same one
    (PiSSA's randomized SVD; OFT's identity start needs no seed)."""
    import torch
    from peft import get_peft_model

    if config.finetuning.finetuning_type == "oft":
        peft_config = oft_config(model, config, add_valuehead)
        logger.info("new OFT adapter: rank %d, block size %d, targets %s", peft_config.r, peft_config.oft_block_size,
                    ",".join(sorted(peft_config.target_modules)))
    else:
        peft_config = lora_config(model, config, add_valuehead)
        logger.info("new LoRA adapter: rank %d, alpha %s, targets %s%s", peft_config.r, peft_config.lora_alpha,
                    ",".join(sorted(peft_config.target_modules)), f", init {peft_config.init_lora_weights}"
                    if peft_config.init_lora_weights is not True else "")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(config.training.get("seed", 42)))
        with _without_peft_deprecation_notice():
            return get_peft_model(model, peft_config)
