"""`load_model`: base weights, adapters, then the finetuning type's trainable set.

The reward model (`add_valuehead=True`) is `AutoModelForSequenceClassification` with one label: the decoder with
a Linear(hidden, 1) `score` head read at each sequence's last non-padding token. It is what trl's RewardTrainer
and PPO value/reward models take, Trainer saves and resumes it natively, and peft's SEQ_CLS task saves the head
beside a LoRA adapter (modules_to_save) in adapter_model.safetensors. trl 1.16 ships no value-head wrapper;
LLaMA-Factory's reward models (trl's old value head beside a causal LM) load through `tuneline.model.value_head`.
"""

from __future__ import annotations

import logging
import os
import pickle

from tuneline.config import RunConfig
from tuneline.config.args import ADAPTER_TYPES
from tuneline.config.checkpointing import checkpointing_kwargs
from tuneline.config.run_config import split_names
from tuneline.config.validate import check_model_path
from tuneline.errors import ConfigError, UserError
from tuneline.model.adapters import add_adapter, attach_adapters, check_adapter_paths
from tuneline.model.batching import attention_kwargs
from tuneline.model.freeze import setup_freeze, setup_full
from tuneline.model.new_tokens import grow_embeddings
from tuneline.model.precision import compute_dtype, quantization_kwargs, trains_on_cpu
from tuneline.model.processor import load_model_config
from tuneline.model.vision import check_freeze_keys, is_vision_language
from tuneline.model.vision_scorer import scorer_class, scorer_config

logger = logging.getLogger("tuneline")

TRAINABLE_SETUPS = {"freeze": setup_freeze, "full": setup_full}


def count_parameters(model) -> tuple[int, int]:
    """(trainable, total) parameter counts; 4-bit weights count as the values they pack, ZeRO-3 shards whole."""
    trainable = total = 0
    for param in model.parameters():
        count = getattr(param, "ds_numel", 0) or param.numel()
        if type(param).__name__ == "Params4bit":
            count *= 2 * getattr(getattr(param, "quant_storage", None), "itemsize", 1)
        total += count
        if param.requires_grad:
            trainable += count
    return trainable, total


def log_parameter_counts(model, is_trainable: bool) -> None:
    """A model loaded for evaluation has no trainable set to report ("trainable params: 0" read as a fault)."""
    trainable, total = count_parameters(model)
    if not is_trainable:
        logger.info("all params: %s", f"{total:,}")
        return
    logger.info("trainable params: %s || all params: %s || trainable%%: %.4f",
                f"{trainable:,}", f"{total:,}", 100 * trainable / max(total, 1))


def model_class(model_config, add_valuehead: bool):
    """The Auto class LLaMA-Factory loads with: image-text-to-text for a vision-language model, else causal LM; a
    one-label sequence scorer for a reward model (for a vision-language one, its family's: `vision_scorer`)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSequenceClassification

    if add_valuehead:
        return scorer_class(model_config) if is_vision_language(model_config) else AutoModelForSequenceClassification
    return AutoModelForImageTextToText if is_vision_language(model_config) else AutoModelForCausalLM


def load_base_model(config: RunConfig, tokenizer, is_trainable: bool, add_valuehead: bool):
    """The pretrained weights in the compute dtype, as a causal LM, a vision-language model or a one-label sequence
    scorer. The freeze_* keys are checked against the model's config before any weight loads."""
    model_config = load_model_config(config)
    check_freeze_keys(model_config, config)
    margs = config.model
    dtype = compute_dtype(config, is_trainable)
    kwargs = dict(dtype=dtype, trust_remote_code=margs.trust_remote_code, revision=margs.model_revision,
                  cache_dir=margs.cache_dir, token=margs.hf_hub_token, **attention_kwargs(config, is_trainable),
                  **quantization_kwargs(config, dtype))
    if add_valuehead and is_vision_language(model_config):
        kwargs.update(config=scorer_config(model_config, tokenizer.pad_token_id))
    elif add_valuehead:
        kwargs.update(num_labels=1, pad_token_id=tokenizer.pad_token_id)
    try:
        model = model_class(model_config, add_valuehead).from_pretrained(margs.model_name_or_path, **kwargs)
    except OSError as exc:
        raise UserError(f"cannot load 'model_name_or_path' '{margs.model_name_or_path}': {exc}") from None
    except pickle.UnpicklingError:  # transformers reads .bin weights with torch.load(weights_only=True)
        raise UserError(f"cannot load 'model_name_or_path' '{margs.model_name_or_path}': its .bin weights hold "
                        "pickled objects other than tensors, which could run code, so they are refused; convert "
                        "the model to safetensors where you trust it") from None
    grow_embeddings(model, tokenizer, margs)
    return model


def _prepare_for_training(model, config: RunConfig) -> None:
    """Trainable weights in fp32 under half-precision autocast (not with BAdam or pure_bf16); gradient checkpointing
    unless turned off."""
    import torch

    half = {torch.float16, torch.bfloat16}
    # BAdam keeps its own fp32 copy of the active block; pure_bf16 trains the bf16 weights themselves
    if not (config.finetuning.use_badam or config.finetuning.pure_bf16):
        for param in model.parameters():
            if param.requires_grad and param.dtype in half:
                param.data = param.data.float()
    if not config.model.disable_gradient_checkpointing:
        enable_checkpointing(model, config)
    model.train()


def enable_checkpointing(model, config: RunConfig) -> None:
    """Recompute each layer's activations in the backward pass instead of keeping them (LLaMA-Factory's default).

    The embeddings' output is made to require grad, so that frozen inputs (LoRA, freeze) still carry gradients
    through reentrant checkpoints. A model without support trains without it, as LLaMA-Factory does, with a warning.
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        logger.warning("gradient checkpointing is on by default, but %s does not support it: training without it "
                       "(more memory); set 'disable_gradient_checkpointing: true' to say so", type(model).__name__)
        return
    if os.environ.get("FSDP_ACTIVATION_CHECKPOINTING") == "true":
        logger.info("gradient checkpointing: FSDP's own (fsdp_activation_checkpointing in the accelerate config)")
        return
    kwargs, layout = checkpointing_kwargs(config)
    if layout.get("offload") and trains_on_cpu(config):
        raise ConfigError("'offload: true' in the checkpointing kwargs keeps checkpointed activations in pinned host "
                          "memory, which needs a GPU; remove it on a CPU run")
    if kwargs["use_reentrant"] and os.environ.get("ACCELERATE_USE_FSDP") == "true" and (
            os.environ.get("FSDP_VERSION") == "2"):
        kwargs["use_reentrant"] = False  # FSDP2 shards parameters on the fly, which reentrant recomputation breaks
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.23: input grads included
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, **layout)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs, **layout)
        model.enable_input_require_grads()
    model.config.use_cache = False  # no cache is kept while checkpointing; saying so spares a warning per run
    logger.info("gradient checkpointing on (%s)", "reentrant" if kwargs["use_reentrant"] else "non-reentrant")


def use_kv_cache(model, enabled: bool) -> None:
    """`use_kv_cache` for a model loaded to generate (training keeps no cache): its config's and its generation
    config's switch, the language model's too in a vision-language model."""
    model.config.use_cache = enabled
    text_config = model.config.get_text_config()
    if text_config is not model.config:
        text_config.use_cache = enabled
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.use_cache = enabled


def _check_request(config: RunConfig, adapters: list[str]) -> None:
    problems = check_model_path(config.model.model_name_or_path, "model_name_or_path")
    if not config.model.model_name_or_path:
        problems.append("'model_name_or_path' is required: a local model folder or a hub id")
    problems += check_adapter_paths(adapters)
    if problems:
        raise UserError(problems)


def load_model(config: RunConfig, tokenizer, is_trainable: bool = True, add_valuehead: bool = False,
               adapters: str | None = None):
    """The model a stage trains or evaluates. `adapters` (comma-separated) replaces `adapter_name_or_path`."""
    adapter_list = split_names(config.model.adapter_name_or_path if adapters is None else adapters)
    _check_request(config, adapter_list)
    model = load_base_model(config, tokenizer, is_trainable, add_valuehead)
    if config.model.quantization_bit is not None and is_trainable:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)  # enabled below, once
    model, keeps_adapter = attach_adapters(model, config, adapter_list, is_trainable)
    finetuning_type = config.finetuning.finetuning_type
    if is_trainable and finetuning_type in ADAPTER_TYPES and not keeps_adapter:
        model = add_adapter(model, config, add_valuehead)
    elif is_trainable and finetuning_type not in ADAPTER_TYPES:
        TRAINABLE_SETUPS[finetuning_type](model, config)
    if is_trainable:
        _prepare_for_training(model, config)
        if count_parameters(model)[0] == 0:
            raise ConfigError(f"'finetuning_type: {finetuning_type}' leaves no trainable parameter; check "
                              "'freeze_trainable_layers', 'freeze_trainable_modules', 'freeze_extra_modules' and, "
                              "on a vision-language model, 'freeze_language_model'")
    else:
        model.requires_grad_(False)
        model.eval()
        use_kv_cache(model, config.model.use_kv_cache)
    log_parameter_counts(model, is_trainable)
    return model
