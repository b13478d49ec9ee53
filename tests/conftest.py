"""Fixtures shared by every test: the offline tiny model and the bundled demo data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# Parallel test workers (pytest-xdist) share the cores: each gets its share of threads, passed on to the trainings
# it starts. torch's OpenMP threads wait for each other at every operation, so more threads than free cores stall
# every one of them; set before torch is imported.
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The "test" preset of the tiny Llama + tokenizer, built once per test session."""
    from tuneline.tiny_model import TINY_PRESETS, build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", **TINY_PRESETS["test"])


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory):
    """`tiny_vlm("llava")`: the folder of a tiny vision-language preset, built once per test session."""
    from tuneline.tiny_vlm import build_tiny_vlm

    built = {}

    def folder(preset: str):
        if preset not in built:
            built[preset] = build_tiny_vlm(tmp_path_factory.mktemp(preset) / "model", preset)
        return built[preset]

    return folder


@pytest.fixture(scope="session")
def demo_data_dir() -> Path:
    """The repo's data/ folder: the demo datasets and their dataset_info.json."""
    return REPO_ROOT / "data"


@pytest.fixture(scope="session")
def empty_mlflow_store(tmp_path_factory) -> Path:
    """An MLflow SQLite file with its schema, created once: creating one is slow, copying it is not."""
    from mlflow import MlflowClient

    db = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}", registry_uri=f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture(scope="session")
def fake_checkpoint():
    """`write(folder, step)`: `folder/checkpoint-<step>` as a LoRA training leaves one (random adapter weights and
    trainer_state.json), for tests of logging, pruning and restoring checkpoints without training."""
    import json

    def write(folder: Path, step: int) -> Path:
        import torch
        from safetensors.torch import save_file

        ckpt = folder / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        save_file({"lora_A": torch.randn(4, 8), "lora_B": torch.randn(8, 4)}, str(ckpt / "adapter_model.safetensors"))
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        return ckpt

    return write
