"""How training batches reach the model: padded, or padding-free, and the attention that runs them.

One decision with the device as an input. Padding-free means the batch's examples end to end in one row with
positions restarting at each example (transformers' `DataCollatorWithFlattening`); packed rows (`packing`) are
built that way already. The attention must then keep the examples apart, and how well it does depends on the
device, which is why the choice is here and not in the config:

- CPU with sdpa: `sdpa_packed` (`tuneline.model.packed_attention`), causal sdpa on each example in turn. Dense
  block-diagonal masks are slow on CPU (benchmarks/packed_attention.py).
- CUDA: transformers reads the example bounds from the position ids: flash attention's variable-length kernels,
  flex_attention's block mask, or sdpa with a block-diagonal mask. benchmarks/batching.py (run by `make
  gpu-check`) compares them with padded batches; flex_attention is fastest there but compiles, so it is the
  user's choice, not a silent switch from sdpa.

Only sft's plain rows are flattened: rm, dpo and kto pair or score whole rows, ppo generates, eager attention
is asked for by name, and a vision-language model's rows carry images whose tokens must stay where they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneline.config import RunConfig
from tuneline.errors import UserError
from tuneline.model.precision import trains_on_cpu
from tuneline.runtime.requirements import attention_problem


@dataclass(frozen=True)
class Batching:
    flatten: bool  # plain sft rows go end to end in one row per batch
    attention: str  # the attn_implementation the training model is loaded with


def vision_language(config: RunConfig) -> bool:
    from tuneline.model.processor import load_model_config
    from tuneline.model.vision import is_vision_language

    return is_vision_language(load_model_config(config))


def training_device(config: RunConfig) -> str:
    return "cpu" if trains_on_cpu(config) else "cuda"


def batching(config: RunConfig, device: str) -> Batching:
    """The batches and attention of a training on `device` ('cpu' or 'cuda')."""
    attention = config.model.attn_implementation
    if problem := attention_problem(attention, device == "cuda"):
        raise UserError(problem)
    padding_free = config.stage == "sft" and attention != "eager" and not vision_language(config)
    if padding_free and device == "cpu":
        from tuneline.model.packed_attention import register_packed_sdpa

        attention = register_packed_sdpa()
    return Batching(flatten=padding_free and not config.effective_packing, attention=attention)


def attention_kwargs(config: RunConfig, is_trainable: bool = False) -> dict:
    """attn_implementation for from_pretrained: the training's choice above, or the config's for inference."""
    device = training_device(config)
    if is_trainable:
        return {"attn_implementation": batching(config, device).attention}
    attention = config.model.attn_implementation
    if problem := attention_problem(attention, device == "cuda"):
        raise UserError(problem)
    return {"attn_implementation": attention}
