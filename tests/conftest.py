"""Fixtures shared by every test: the offline tiny model and the bundled demo data."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The "test" preset of the tiny Llama + tokenizer, built once per test session (about 5 s)."""
    from tuneline.tiny_model import TINY_PRESETS, build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", **TINY_PRESETS["test"])


@pytest.fixture(scope="session")
def demo_data_dir() -> Path:
    """The repo's data/ folder: the demo datasets and their dataset_info.json."""
    return REPO_ROOT / "data"
