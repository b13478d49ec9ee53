"""Fixtures for the model tests: configs on the shared tiny model, its tokenizer, and one fixed batch."""

from __future__ import annotations

import pytest


@pytest.fixture
def make_config(tiny_model_dir, tmp_path):
    """RunConfig on the tiny model; keyword arguments are YAML keys."""
    from tuneline.config import load_config

    def make(**keys):
        base = {"model_name_or_path": str(tiny_model_dir), "dataset": "unused", "output_dir": str(tmp_path / "out")}
        return load_config(None, {**base, **keys}, check_paths=False)

    return make


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from tuneline.config import load_config
    from tuneline.model import load_tokenizer

    return load_tokenizer(load_config(None, {"model_name_or_path": str(tiny_model_dir), "dataset": "x"},
                                      check_paths=False).model)


@pytest.fixture(scope="session")
def batch():
    import torch

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 500, (2, 12), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
