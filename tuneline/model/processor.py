"""A vision-language model's processor (image processor + tokenizer + chat template): load it, save it beside the
weights, and into every checkpoint, so each checkpoint loads on its own as LLaMA-Factory's do (SaveProcessorCallback).
A text model has none: `load_processor` returns None for it."""

from __future__ import annotations

import logging
from pathlib import Path

from tuneline.config.args import ModelArgs
from tuneline.errors import UserError

logger = logging.getLogger("tuneline")


def _model_args(config) -> ModelArgs:
    return getattr(config, "model", config)  # a RunConfig or its ModelArgs


def _hub_kwargs(model_args: ModelArgs) -> dict:
    return {"cache_dir": model_args.cache_dir, "revision": model_args.model_revision, "token": model_args.hf_hub_token,
            "trust_remote_code": model_args.trust_remote_code}


def load_model_config(config):
    """The model's PretrainedConfig (config.json only, no weights)."""
    from transformers import AutoConfig

    model_args = _model_args(config)
    try:
        return AutoConfig.from_pretrained(model_args.model_name_or_path, **_hub_kwargs(model_args))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot load 'model_name_or_path' '{model_args.model_name_or_path}': {exc}") from None


def load_processor(config, tokenizer=None):
    """AutoProcessor of a vision-language model, or None for a text model. `tokenizer` (the one `load_tokenizer`
    returned, added tokens included) replaces the processor's own, so both encode text alike."""
    from transformers import AutoProcessor, ProcessorMixin

    from tuneline.model.image_only_processor import ImageOnlyProcessor, load_image_only_processor
    from tuneline.model.pixtral_processor import has_pixtral_tower, load_pixtral_image_only
    from tuneline.model.vision import is_vision_language

    model_args = _model_args(config)
    if not is_vision_language(load_model_config(model_args)):
        return None
    name = model_args.model_name_or_path
    try:
        processor = AutoProcessor.from_pretrained(name, use_fast=model_args.use_fast_tokenizer,
                                                  **_hub_kwargs(model_args))
    except ImportError as exc:
        if "torchvision" not in str(exc).lower():
            raise
        model_config = load_model_config(model_args)
        if has_pixtral_tower(model_config):  # a processor whose image half suffices: Pixtral's, or Qwen-VL's below
            processor = load_pixtral_image_only(model_args, _hub_kwargs(model_args))
        else:
            processor = load_image_only_processor(model_args, model_config, _hub_kwargs(model_args), exc)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot load the processor of the vision-language model '{name}': {exc}") from None
    if not isinstance(processor, (ProcessorMixin, ImageOnlyProcessor)):
        raise UserError(f"'{name}' is a vision-language model but holds no processor files (processor_config.json or "
                        "preprocessor_config.json): its images cannot be turned into model inputs")
    if tokenizer is not None:
        processor.tokenizer = tokenizer
    return processor


def save_processor(processor, folder: str | Path) -> None:
    """Write the processor's files (its tokenizer's too) into `folder`; a text model's None writes nothing."""
    if processor is not None:
        processor.save_pretrained(str(folder))


def _callback_class():
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    class SaveProcessorCallback(TrainerCallback):
        """Saves the processor into each checkpoint folder when it is written, and into output_dir at the end."""

        def __init__(self, processor):
            self.processor = processor

        def on_save(self, args, state, control, **kwargs):
            if args.should_save:
                save_processor(self.processor, Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")

        def on_train_end(self, args, state, control, **kwargs):
            if args.should_save:
                save_processor(self.processor, args.output_dir)

    return SaveProcessorCallback


def __getattr__(name: str):
    if name == "SaveProcessorCallback":  # built on first use so importing this module needs no transformers
        cls = _callback_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module 'tuneline.model.processor' has no attribute '{name}'")
