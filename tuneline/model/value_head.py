"""LLaMA-Factory's reward models (trl's `AutoModelForCausalLMWithValueHead`), scored as LLaMA-Factory scores them.

`ValueHeadScorer` is the LM with `value_head.safetensors` (one value per token); the language-model head is
dropped, as no score reads it and its vocabulary-sized output would only cost memory."""

from __future__ import annotations

from pathlib import Path

import torch

from tuneline.errors import ConfigError

VALUE_HEAD_FILES = ("value_head.safetensors", "value_head.bin")  # LLaMA-Factory's names, safetensors first
WEIGHT_KEY, BIAS_KEY = "v_head.summary.weight", "v_head.summary.bias"


def find_value_head(folder: str | Path) -> Path | None:
    """The value-head file in `folder`, or None where LLaMA-Factory saved none."""
    return next((Path(folder) / name for name in VALUE_HEAD_FILES if (Path(folder) / name).is_file()), None)


def read_value_head(path: Path, hidden_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight [1, hidden], bias [1]) from a value-head file; a ConfigError naming the file when it is not one."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: whichever library fails, the fix is the same
        raise ConfigError(f"'{path}' is not a readable value head ({type(exc).__name__}: {str(exc)[:200]}); "
                          "save the reward model again with LLaMA-Factory's stage: rm") from None
    state = state if isinstance(state, dict) else {}
    weight, bias = state.get(WEIGHT_KEY), state.get(BIAS_KEY)
    if weight is None or bias is None:
        raise ConfigError(f"'{path}' holds no LLaMA-Factory value head: it needs '{WEIGHT_KEY}' and '{BIAS_KEY}', "
                          f"it has {', '.join(sorted(map(str, state))) or 'no tensors'}")
    if tuple(weight.shape) != (1, hidden_size) or tuple(bias.shape) != (1,):
        raise ConfigError(f"the value head in '{path}' has weight {tuple(weight.shape)} and bias {tuple(bias.shape)}, "
                          f"but the model's hidden size is {hidden_size} (expected (1, {hidden_size}) and (1,)): it "
                          "was trained on another base model")
    return weight, bias


class ValueHeadScorer(torch.nn.Module):
    """The decoder of a causal LM and a value head: one value per token, in the decoder's dtype."""

    def __init__(self, causal_lm, weight: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        self.decoder = causal_lm.base_model  # the transformer without its language-model head
        self.config = causal_lm.config
        dtype = next(self.decoder.parameters()).dtype  # LLaMA-Factory casts the head to the compute dtype too
        self.summary = torch.nn.Linear(weight.shape[1], 1, dtype=dtype)
        with torch.no_grad():
            self.summary.weight.copy_(weight)
            self.summary.bias.copy_(bias)
        self.requires_grad_(False)

    def forward(self, input_ids, attention_mask=None, **kwargs):
        from transformers.modeling_outputs import TokenClassifierOutput

        hidden = self.decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return TokenClassifierOutput(logits=self.summary(hidden.to(self.summary.weight.dtype)))


def load_value_head_model(config, tokenizer, head_file: Path) -> ValueHeadScorer:
    """A LLaMA-Factory reward model: `config`'s model (adapters merged) as a causal LM, with the head in
    `head_file`, frozen and in eval mode."""
    from tuneline.model.loader import load_model

    causal_lm = load_model(config, tokenizer, is_trainable=False)
    weight, bias = read_value_head(head_file, causal_lm.config.get_text_config().hidden_size)
    return ValueHeadScorer(causal_lm, weight, bias).eval()
