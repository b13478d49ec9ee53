"""build-reference-model: which configs need it, what its key depends on, and the stored log-prob columns."""

from __future__ import annotations

import shutil

import pytest

from tuneline.config import load_config
from tuneline.reference import build_reference_logps, needs_reference, reference_fingerprint


def make_config(tmp_path, model_dir, **overrides):
    values = {"model_name_or_path": str(model_dir), "stage": "dpo", "dataset": "demo_pref",
              "dataset_dir": "data", "cutoff_len": 128, "output_dir": str(tmp_path / "out"),
              "pipeline_cache_dir": str(tmp_path / "cache"), **overrides}
    return load_config(overrides=values, check_paths=False)


@pytest.mark.parametrize(("overrides", "expected"), [
    ({}, True),
    ({"pref_loss": "hinge"}, True),
    ({"stage": "kto", "dataset": "demo_kto"}, True),
    ({"pref_loss": "orpo"}, False),
    ({"pref_loss": "simpo"}, False),
    ({"precompute_ref": False}, False),
    ({"stage": "sft", "dataset": "demo_sft"}, False),
    ({"stage": "rm"}, False),
    ({"stage": "pt", "dataset": "demo_pt"}, False),
])
def test_needs_reference(tmp_path, overrides, expected):
    assert needs_reference(make_config(tmp_path, tmp_path, **overrides)) is expected


def test_key_ignores_what_only_shapes_training(tmp_path, tiny_model_dir):
    base = reference_fingerprint(make_config(tmp_path, tiny_model_dir), "data-1")
    for overrides in ({"pref_beta": 0.5}, {"pref_loss": "ipo"}, {"pref_loss": "hinge"}, {"learning_rate": 1e-3},
                      {"num_train_epochs": 7}, {"dpo_label_smoothing": 0.1}, {"pref_ftx": 1.0}):
        assert reference_fingerprint(make_config(tmp_path, tiny_model_dir, **overrides), "data-1") == base, overrides


def test_key_follows_model_data_and_tokenization(tmp_path, tiny_model_dir):
    config = make_config(tmp_path, tiny_model_dir)
    base = reference_fingerprint(config, "data-1")
    assert reference_fingerprint(config, "data-2") != base
    assert reference_fingerprint(make_config(tmp_path, tiny_model_dir, cutoff_len=64), "data-1") != base
    assert reference_fingerprint(make_config(tmp_path, tiny_model_dir, template="chatml"), "data-1") != base
    assert reference_fingerprint(make_config(tmp_path, tiny_model_dir, stage="kto"), "data-1") != base
    # Same weights elsewhere: same key. Changed weights at the same path: a new key.
    copy = shutil.copytree(tiny_model_dir, tmp_path / "copy")
    assert reference_fingerprint(make_config(tmp_path, tiny_model_dir, ref_model=str(copy)), "data-1") != base
    same_a = reference_fingerprint(make_config(tmp_path, tiny_model_dir, ref_model=str(copy)), "data-1")
    weights = next(copy.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert reference_fingerprint(make_config(tmp_path, tiny_model_dir, ref_model=str(copy)), "data-1") != same_a


def test_not_needed_returns_at_once(tmp_path):
    # The model path does not exist: proof that nothing is loaded.
    config = make_config(tmp_path, tmp_path / "missing", pref_loss="simpo")
    ref = build_reference_logps(config, {"path": str(tmp_path / "nowhere"), "fingerprint": "d"})
    assert ref["needed"] is False and "simpo" in ref["reason"] and ref["fingerprint"]
    assert not (tmp_path / "cache").exists()
