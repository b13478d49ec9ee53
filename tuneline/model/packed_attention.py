"""`sdpa_packed`: transformers' sdpa, run on each example of a packed row alone, for faster packed sft on CPU.

Why: a packed sft row (`tuneline.data.packing`) reaches sdpa with the block-diagonal causal mask transformers builds
from the position resets, and on CPU sdpa with a dense mask computes all the row's token pairs, where causal sdpa on
each example in turn computes only the pairs within an example (`benchmarks/packed_attention.py` measures both).

The per-example path runs only when the call's mask is exactly the block-diagonal causal mask of its
`position_ids` (a new example wherever a position is not the previous one plus 1, as transformers reads them),
checked once per forward and reused by every layer. Every other call (no packing, a padding mask, generation with
a KV cache, position bias) goes unchanged to transformers' `sdpa_attention_forward` with the mask it was given,
and the name's mask function is sdpa's, so transformers builds the masks it builds for sdpa. `config.json` does
not keep the name (transformers never serializes `_attn_implementation`): saved models load anywhere.
"""

from __future__ import annotations

import itertools
import weakref

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

PACKED_SDPA = "sdpa_packed"
# Arguments of sdpa_attention_forward the per-example path does not implement: any of them set means sdpa's way.
_SDPA_ONLY = ("position_bias", "cache", "softcap")

# (mask, position_ids, their versions, segments) of the last check; every layer of a forward passes the same two.
_last_check: tuple = ()


def register_packed_sdpa() -> str:
    """Register the attention and mask functions under `PACKED_SDPA` (idempotent); returns the name."""
    AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention_forward)
    AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)
    return PACKED_SDPA


def block_diagonal_segments(attention_mask: torch.Tensor, position_ids: torch.Tensor) -> list[tuple[int, int, int]]:
    """(row, start, end) of each packed example, or [] unless the mask is their block-diagonal causal mask."""
    batch, length = attention_mask.shape[0], attention_mask.shape[-1]
    positions = position_ids.expand(batch, -1)
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[:, 1:] = positions[:, 1:] != positions[:, :-1] + 1
    example = starts.cumsum(-1)
    causal = torch.ones(length, length, dtype=torch.bool, device=attention_mask.device).tril()
    if not torch.equal(attention_mask[:, 0], (example[:, :, None] == example[:, None, :]) & causal):
        return []
    bounds = starts.nonzero().tolist() + [[batch, 0]]
    return [(row, start, next_start if next_row == row else length)
            for (row, start), (next_row, next_start) in itertools.pairwise(bounds)]


def packed_segments(query: torch.Tensor, key: torch.Tensor, attention_mask, position_ids) -> list:
    """The examples to attend one by one, or [] when this call is not a packed one (sdpa then runs as is)."""
    global _last_check
    if (attention_mask is None or attention_mask.dtype != torch.bool or position_ids is None
            or position_ids.ndim != 2 or torch.compiler.is_compiling() or torch.jit.is_tracing()):
        return []
    batch, length = query.shape[0], query.shape[2]
    if (length < 2 or key.shape[2] != length or tuple(attention_mask.shape) != (batch, 1, length, length)
            or position_ids.shape[-1] != length or position_ids.shape[0] not in (1, batch)):
        return []
    versions = (attention_mask._version, position_ids._version)
    if _last_check and _last_check[0]() is attention_mask and _last_check[1]() is position_ids \
            and _last_check[2] == versions:
        return _last_check[3]
    segments = block_diagonal_segments(attention_mask, position_ids)
    _last_check = (weakref.ref(attention_mask), weakref.ref(position_ids), versions, segments)
    return segments


def packed_sdpa_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                  scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """sdpa's signature and output ((batch, tokens, heads, head_dim), None); causal sdpa per packed example."""
    segments = []
    if all(kwargs.get(name) is None for name in _SDPA_ONLY):
        segments = packed_segments(query, key, attention_mask, kwargs.get("position_ids"))
    if not segments:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    gqa = {}
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:  # as sdpa does without a mask: native GQA where the kernel has it, repeated heads elsewhere
        if torch.__version__ >= "2.5" and key.shape[-1] == value.shape[-1] <= 256:
            gqa["enable_gqa"] = True
        else:
            key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    batch, heads, length, _ = query.shape
    sizes = [end - start for _, start, end in segments]

    def examples(states):  # one split for all, so the backward pass is one concatenation, not a copy per example
        return [piece.transpose(0, 1)[None] for piece in
                states.transpose(1, 2).reshape(batch * length, states.shape[1], -1).split(sizes)]

    outputs = [torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling,
                                                                is_causal=True, **gqa).transpose(1, 2)
               for q, k, v in zip(examples(query), examples(key), examples(value), strict=True)]
    return torch.cat(outputs, dim=1).view(batch, length, heads, value.shape[-1]), None
