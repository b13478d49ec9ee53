"""The reward model, loaded and read out one way for PPO and for the evaluate step, which must give the same number for
the same policy.

Takes what `tuneline.train.rm` saves (a one-label sequence classifier, full or SEQ_CLS LoRA) or what LLaMA-Factory's rm
stage saves (a causal LM with `value_head.safetensors`); anything else is refused rather than given a random head."""

from __future__ import annotations

import copy
from pathlib import Path

from tuneline.config.run_config import split_names
from tuneline.errors import ConfigError


def reward_config(config):
    """A copy of the run config whose model is the reward model, with its adapters merged in."""
    ft = config.finetuning
    rcfg = copy.deepcopy(config)
    if ft.reward_model_type == "full":
        rcfg.model.model_name_or_path = ft.reward_model
        rcfg.model.adapter_name_or_path = ft.reward_model_adapters
        rcfg.finetuning.finetuning_type = "full"
    else:  # a LoRA adapter on the policy's base model (and the adapters the base carries)
        existing = [a for a in (config.model.adapter_name_or_path or "").split(",") if a.strip()]
        rcfg.model.adapter_name_or_path = ",".join([*existing, ft.reward_model])
    rcfg.model.quantization_bit = None
    return rcfg


def check_reward_tokenizer(config, tokenizer) -> None:
    """The reward model reads the policy's token ids, so both must share one vocabulary."""
    from transformers import AutoTokenizer

    folder = Path(config.finetuning.reward_model)
    if not (folder / "tokenizer_config.json").is_file():
        return  # nothing saved beside it: it uses the base model's tokenizer
    theirs = AutoTokenizer.from_pretrained(str(folder))
    if theirs.get_vocab() != tokenizer.get_vocab():
        raise ConfigError(f"'reward_model: {folder}' has a tokenizer that does not match the policy's "
                          f"('{config.model.model_name_or_path}'): train the reward model on the same base model")


def load_reward_model(config, tokenizer):
    """The frozen reward model, in eval mode."""
    from tuneline.model import load_model

    ft = config.finetuning
    if not ft.reward_model and config.pipeline.reward_model_config:
        raise ConfigError("'reward_model_config' is trained by the flow (`tuneline train`); outside it, train that "
                          "config and set 'reward_model' to its output_dir")
    if not ft.reward_model:
        raise ConfigError("'stage: ppo' needs 'reward_model' (a reward model path or adapter trained with stage: rm)")
    if not Path(ft.reward_model).exists():
        raise ConfigError(f"'reward_model: {ft.reward_model}' does not exist; train one with 'stage: rm'")
    is_adapter = (Path(ft.reward_model) / "adapter_config.json").is_file()
    if is_adapter != (ft.reward_model_type == "lora"):
        kind = "a LoRA adapter" if is_adapter else "a full model"
        raise ConfigError(f"'reward_model: {ft.reward_model}' is {kind} but 'reward_model_type' is "
                          f"'{ft.reward_model_type}'; set 'reward_model_type: {'lora' if is_adapter else 'full'}'")
    check_reward_tokenizer(config, tokenizer)
    rcfg = reward_config(config)
    head_file = llamafactory_value_head(config)
    if head_file is not None:
        from tuneline.model.value_head import load_value_head_model

        return load_value_head_model(rcfg, tokenizer, head_file)
    check_tuneline_reward_model(config)
    return load_model(rcfg, tokenizer, is_trainable=False, add_valuehead=True).eval()


def llamafactory_value_head(config) -> Path | None:
    """LLaMA-Factory's value-head file where it would read it: beside `reward_model`, or for a full reward model
    with `reward_model_adapters`, beside the last adapter. None for a tuneline reward model."""
    from tuneline.model.value_head import find_value_head

    ft = config.finetuning
    adapters = split_names(ft.reward_model_adapters)
    return find_value_head(adapters[-1] if ft.reward_model_type == "full" and adapters else ft.reward_model)


def check_tuneline_reward_model(config) -> None:
    """A reward model without a value head must be tuneline's one-label sequence scorer, or loading it would put
    a randomly initialised head on a language model and score with that."""
    folder = Path(config.finetuning.reward_model)
    if config.finetuning.reward_model_type == "lora":
        task = _json(folder / "adapter_config.json").get("task_type")
        if task == "SEQ_CLS":
            return
        found = f"a LoRA adapter for {task or 'an unknown task'}"
    else:
        saved = _json(folder / "config.json")
        architecture = ",".join(saved.get("architectures") or []) or "folder without a model's config.json"
        labels = len(saved.get("id2label") or {})
        scorer = architecture.endswith("ForSequenceClassification")
        if scorer and labels == 1:
            return
        found = f"a {architecture} with {labels} labels" if scorer else f"a {architecture}"
    raise ConfigError(f"'reward_model: {folder}' is {found}, not a reward model: tuneline's (stage: rm saves a "
                      "one-label sequence classifier) or LLaMA-Factory's (value_head.safetensors or value_head.bin "
                      "beside the weights or adapter). Point 'reward_model' at the output_dir of a stage: rm run")


def _json(path: Path) -> dict:
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def sequence_scores(model, input_ids, attention_mask, **media_inputs):
    """One score per row: a sequence classifier's pooled output, or a per-token value at the last real token.
    `media_inputs`: the rows' pixels and the vision inputs that go with them, for a vision-language scorer."""
    import torch

    logits = model(input_ids=input_ids, attention_mask=attention_mask, **media_inputs).logits
    if logits.dim() == 3:  # per-token values [batch, length, 1]
        positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        last = (positions * attention_mask).argmax(-1)
        logits = logits[torch.arange(len(last), device=last.device), last]
    return logits.reshape(len(input_ids), -1)[:, 0]

