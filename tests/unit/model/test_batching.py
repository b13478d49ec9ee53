"""The one batching decision: padding-free sft wherever the device's attention keeps examples apart."""

from __future__ import annotations

import pytest

from tuneline.errors import UserError
from tuneline.model.batching import Batching, attention_kwargs, batching
from tuneline.model.packed_attention import PACKED_SDPA
from tuneline.runtime.requirements import installed


def test_cpu_sft_is_flattened_and_run_per_example(make_config):
    assert batching(make_config(), "cpu") == Batching(flatten=True, attention=PACKED_SDPA)
    # packed rows are padding-free already: no flattening, the same attention
    assert batching(make_config(packing=True), "cpu") == Batching(flatten=False, attention=PACKED_SDPA)
    neat = make_config(neat_packing=True)  # as in LLaMA-Factory, neat_packing alone turns packing on
    assert neat.effective_packing and batching(neat, "cpu") == Batching(flatten=False, attention=PACKED_SDPA)


def test_cuda_sft_is_flattened_for_transformers_own_attention(make_config):
    assert batching(make_config(), "cuda") == Batching(flatten=True, attention="sdpa")
    assert batching(make_config(packing=True), "cuda") == Batching(flatten=False, attention="sdpa")
    flex = make_config(attn_implementation="flex_attention")
    assert batching(flex, "cuda") == Batching(flatten=True, attention="flex_attention")
    with pytest.raises(UserError, match="flex_attention' needs a CUDA GPU"):
        batching(flex, "cpu")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_other_stages_and_eager_keep_padded_batches(make_config, device):
    for stage in ("pt", "rm", "dpo", "kto"):
        assert batching(make_config(stage=stage), device) == Batching(flatten=False, attention="sdpa")
    assert batching(make_config(attn_implementation="eager"), device) == Batching(flatten=False, attention="eager")


def test_flash_attention_flattens_on_cuda_and_is_refused_where_it_cannot_run(make_config):
    config = make_config(attn_implementation="flash_attention_2")
    with pytest.raises(UserError, match="flash_attention_2"):
        batching(config, "cpu")
    if installed("flash_attn"):  # not installable here (no CUDA); the GPU machine's check covers it
        assert batching(config, "cuda") == Batching(flatten=True, attention="flash_attention_2")
    else:
        with pytest.raises(UserError, match="flash-attn"):
            batching(config, "cuda")


def test_inference_loads_the_configured_attention(make_config, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU machine, also on a GPU runner
    assert attention_kwargs(make_config(), is_trainable=True) == {"attn_implementation": PACKED_SDPA}
    assert attention_kwargs(make_config(), is_trainable=False) == {"attn_implementation": "sdpa"}
    assert attention_kwargs(make_config(use_cpu=True, stage="dpo"), is_trainable=True) == {"attn_implementation": "sdpa"}
