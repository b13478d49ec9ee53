"""A checkpoint damaged after it was published (a truncated safetensors or optimizer file) is detected before
resuming, set aside with a warning naming the file, and the checkpoint before it is resumed; it is never loaded."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from tuneline.train.output_dir import decide_resume, unreadable_file


def _checkpoint(path: Path) -> Path:
    path.mkdir(parents=True)
    save_file({"weight": torch.arange(64, dtype=torch.float32)}, str(path / "adapter_model.safetensors"))
    torch.save({"state": {0: torch.ones(8)}}, path / "optimizer.pt")
    (path / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    return path


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def test_a_whole_checkpoint_reads(tmp_path):
    assert unreadable_file(_checkpoint(tmp_path / "checkpoint-2")) is None


def test_a_truncated_optimizer_file_is_named(tmp_path):
    checkpoint = _checkpoint(tmp_path / "checkpoint-2")
    _truncate(checkpoint / "optimizer.pt")
    assert unreadable_file(checkpoint).startswith("optimizer.pt does not read")


def test_a_truncated_safetensors_checkpoint_is_set_aside_and_the_one_before_resumed(tmp_path, caplog):
    out = tmp_path / "out"
    _checkpoint(out / "checkpoint-2")
    _truncate(_checkpoint(out / "checkpoint-4") / "adapter_model.safetensors")
    (out / "run.json").write_text(json.dumps({"train_key": "k"}))
    with caplog.at_level(logging.WARNING, logger="tuneline.train.output_dir"):
        assert decide_resume(out, "k") == out / "checkpoint-2"
    [aside] = sorted(tmp_path.glob("out.superseded-*"))
    assert (aside / "checkpoint-4" / "adapter_model.safetensors").is_file(), "moved aside, not deleted"
    assert "adapter_model.safetensors does not read" in caplog.text and str(aside) in caplog.text
