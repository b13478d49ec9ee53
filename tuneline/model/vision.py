"""Vision-language models: which modules are the vision tower, the projector and the language model, per family.

The parts are LLaMA-Factory 0.9.5's (`COMPOSITE_MODELS` in model/model_utils/visual.py), so `freeze_vision_tower`,
`freeze_multi_modal_projector` and `freeze_language_model` freeze what they freeze there. A part is a dotted path
matched on whole name segments ("visual.merger" matches "model.visual.merger.mlp.0.weight"), where LLaMA-Factory
matches substrings.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneline.config import RunConfig
from tuneline.errors import ConfigError

FREEZE_KEYS = ("freeze_vision_tower", "freeze_multi_modal_projector", "freeze_language_model")
FREEZE_DEFAULTS = {"freeze_vision_tower": True, "freeze_multi_modal_projector": True, "freeze_language_model": False}


@dataclass(frozen=True)
class CompositeParts:
    projector: tuple[str, ...] = ("multi_modal_projector",)
    vision_tower: tuple[str, ...] = ("vision_tower",)
    language_model: tuple[str, ...] = ("language_model", "lm_head")
    lora_conflicts: tuple[str, ...] = ()  # modules LoRA never adapts (Qwen's Conv3d patch embedding)


_QWEN = CompositeParts(projector=("visual.merger",), vision_tower=("visual.patch_embed", "visual.blocks"),
                       lora_conflicts=("patch_embed",))
_QWEN3 = CompositeParts(projector=("visual.merger",), lora_conflicts=("patch_embed",),
                        vision_tower=("visual.pos_embed", "visual.patch_embed", "visual.blocks",
                                      "visual.deepstack_merger_list"))

COMPOSITE_MODELS: dict[str, CompositeParts] = {
    **dict.fromkeys(("gemma3", "llava", "llava_next", "llava_next_video", "paligemma", "internvl", "video_llava"),
                    CompositeParts()),
    "mistral3": CompositeParts(projector=("model.multi_modal_projector",)),
    "mllama": CompositeParts(vision_tower=("vision_model",)),
    "llama4": CompositeParts(vision_tower=("vision_model",)),
    "qwen2_vl": _QWEN,
    "qwen2_5_vl": _QWEN,
    "glm4v": _QWEN,
    "glm4v_moe": _QWEN,
    "qwen3_vl": _QWEN3,
    "qwen3_vl_moe": _QWEN3,
    "minicpmv4_6": CompositeParts(projector=("model.merger",), vision_tower=("model.vision_tower",),
                                  language_model=("model.language_model", "lm_head")),
}


def is_vision_language(model_config) -> bool:
    """A model with an image side: a known family, or any config with a `vision_config`."""
    return model_config.model_type in COMPOSITE_MODELS or getattr(model_config, "vision_config", None) is not None


def composite_parts(model_config) -> CompositeParts | None:
    return COMPOSITE_MODELS.get(model_config.model_type)


def in_part(name: str, keys: tuple[str, ...] | list[str]) -> bool:
    """Whether the dotted module or parameter `name` lies inside one of the parts `keys`."""
    padded = f".{name}."
    return any(f".{key}." in padded for key in keys)


def frozen_parts(model_config, config: RunConfig) -> tuple[str, ...]:
    """The parts the freeze_* keys keep frozen (LLaMA-Factory's `get_forbidden_modules`); none for a text model."""
    parts, ft = composite_parts(model_config), config.finetuning
    if parts is None:
        return ()
    return ((parts.vision_tower if ft.freeze_vision_tower else ())
            + (parts.projector if ft.freeze_multi_modal_projector else ())
            + (parts.language_model if ft.freeze_language_model else ()))


def check_freeze_keys(model_config, config: RunConfig) -> None:
    """The freeze_* keys need a model whose parts are known. LLaMA-Factory ignores them on a text model; here a
    non-default value there is refused, since it would change nothing (the defaults are what a text model does)."""
    if model_config.model_type in COMPOSITE_MODELS:
        return
    ft = config.finetuning
    if is_vision_language(model_config):
        raise ConfigError(f"'{config.model.model_name_or_path}' is a vision-language model of type "
                          f"'{model_config.model_type}', whose vision tower and projector tuneline cannot tell apart "
                          f"(known types: {', '.join(sorted(COMPOSITE_MODELS))}); it cannot be trained here")
    problems = [f"'{key}: {str(getattr(ft, key)).lower()}' has no effect: '{config.model.model_name_or_path}' is a "
                f"text-only '{model_config.model_type}' model, with no vision tower or projector; remove it"
                for key in FREEZE_KEYS if getattr(ft, key) != FREEZE_DEFAULTS[key]]
    if problems:
        raise ConfigError(problems)


def frozen_parameter_names(model, config: RunConfig) -> set[str]:
    keys = frozen_parts(model.config, config)
    return {name for name, _ in model.named_parameters() if in_part(name, keys)}
