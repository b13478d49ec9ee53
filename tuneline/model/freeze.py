"""Which parameters train for `finetuning_type: freeze` and `full`.

Layers are found as the language model's ModuleList with `num_hidden_layers` entries, outside any vision part, so
a vision tower's numbered blocks never match by accident. On a vision-language model the freeze_* keys then take
their parts out of the trainable set, and an unfrozen projector trains beside the chosen layers, as in
LLaMA-Factory."""

from __future__ import annotations

import logging

from tuneline.config import RunConfig
from tuneline.config.run_config import split_names
from tuneline.errors import ConfigError, did_you_mean
from tuneline.model.vision import composite_parts, frozen_parameter_names, in_part

logger = logging.getLogger("tuneline")

# The value head of a reward model is new: it always trains.
HEAD_NAMES = ("score", "v_head")


def decoder_layers_prefix(model) -> tuple[str, int]:
    """('model.layers', 4): the dotted name of the decoder layer list and its length."""
    import torch

    config = model.config
    count = getattr(config, "num_hidden_layers", None) or getattr(getattr(config, "text_config", None),
                                                                   "num_hidden_layers", None)
    parts = composite_parts(config)
    image_side = (parts.vision_tower + parts.projector) if parts else ()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count and not in_part(name, image_side):
            return name, count
    raise ConfigError(f"'finetuning_type: freeze' cannot find the {count} decoder layers of this "
                      f"{config.model_type} model; use 'finetuning_type: lora' or 'full'")


def trainable_layer_ids(count: int, freeze_trainable_layers: int) -> list[int]:
    """Last n layers for n > 0, first |n| for n < 0."""
    if freeze_trainable_layers > 0:
        return list(range(max(0, count - freeze_trainable_layers), count))
    return list(range(min(-freeze_trainable_layers, count)))


def _in_layer_modules(relative: str, modules: list[str]) -> bool:
    parts = relative.split(".")
    return "all" in modules or any(m in parts[:-1] for m in modules)


def freeze_parameter_names(model, config: RunConfig) -> set[str]:
    """Names of the parameters that train under freeze tuning; raises ConfigError for unknown module names."""
    ft = config.finetuning
    prefix, count = decoder_layers_prefix(model)
    ids = trainable_layer_ids(count, ft.freeze_trainable_layers)
    modules, extra = split_names(ft.freeze_trainable_modules) or ["all"], split_names(ft.freeze_extra_modules)
    names = [n for n, _ in model.named_parameters()]
    inside = {n for n in names if n.startswith(prefix + ".")}
    layer_modules = {part for n in inside for part in n[len(prefix) + 1:].split(".")[1:-1]}
    outside_modules = {part for n in names if n not in inside for part in n.split(".")[:-1]}
    problems = [f"'freeze_trainable_modules' names '{m}', which no decoder layer has{did_you_mean(m, layer_modules)}"
                f"; layer modules: {', '.join(sorted(layer_modules))}" for m in modules
                if m != "all" and m not in layer_modules]
    problems += [f"'freeze_extra_modules' names '{m}', which is no module outside the decoder layers"
                 f"{did_you_mean(m, outside_modules)}; those modules: {', '.join(sorted(outside_modules))}"
                 for m in extra if m not in outside_modules]
    if problems:
        raise ConfigError(problems)
    parts = composite_parts(model.config)
    unfrozen_projector = parts.projector if parts and not ft.freeze_multi_modal_projector else ()
    trainable = set()
    for name in names:
        if in_part(name, unfrozen_projector):
            trainable.add(name)
        elif name in inside:
            layer, _, relative = name[len(prefix) + 1:].partition(".")
            if int(layer) in ids and _in_layer_modules(relative, modules):
                trainable.add(name)
        elif any(part in extra or part in HEAD_NAMES for part in name.split(".")[:-1]):
            trainable.add(name)
    logger.info("freeze tuning: trainable layers %s of %d (%s)", ids, count, ",".join(modules))
    return trainable - frozen_parameter_names(model, config)


def setup_freeze(model, config: RunConfig) -> None:
    trainable = freeze_parameter_names(model, config)
    for name, param in model.named_parameters():
        param.requires_grad_(name in trainable)


def setup_full(model, config: RunConfig) -> None:
    """Everything trains but the parts the freeze_* keys keep frozen (a vision-language model's tower, by default)."""
    frozen = frozen_parameter_names(model, config)
    for name, param in model.named_parameters():
        param.requires_grad_(name not in frozen)
