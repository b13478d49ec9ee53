"""Fixtures for the trainer tests: the tiny model's tokenizer and the sft splits saved to disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.training import make_splits


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def sft_dataset_dir(tiny_model_dir, tokenizer, tmp_path_factory) -> Path:
    """The sft splits saved to disk, as the data step stores them (for subprocess runs)."""
    path = tmp_path_factory.mktemp("sft_data") / "dataset"
    make_splits(tokenizer, "sft", train=48, validation=8).save_to_disk(str(path))
    return path
