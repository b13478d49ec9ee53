"""The `tuneline` command: a user's mistake ends in one message and exit code 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_missing_config_is_one_message_and_exit_code_2(tmp_path):
    for command in (["-m", "cli.main", "validate"], ["-m", "cli.main", "train"], ["-m", "flows.finetune"]):
        out = subprocess.run([sys.executable, *command, str(tmp_path / "missing.yaml")], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 2, (command, out.stderr)
        assert "missing.yaml" in out.stderr and "Traceback" not in out.stderr, (command, out.stderr)
        assert "prefect" not in out.stderr.lower(), "refused before any flow run starts"


def test_a_run_that_cannot_work_is_refused_before_anything_starts(tmp_path, tiny_model_dir):
    """Checked from the config, its files and this machine (no GPU here, and CUDA_VISIBLE_DEVICES says so), every
    problem in one message, before Prefect is imported or any process starts."""
    repo = Path(__file__).resolve().parents[2]
    config = tmp_path / "c.yaml"
    config.write_text(f"model_name_or_path: {tiny_model_dir}\ndataset: demo_sft\ndataset_dir: {repo / 'data'}\n"
                      "template: chatm\nper_device_train_batch_size: -2\nquantization_bit: 4\nfp16: true\n"
                      f"output_dir: {tmp_path / 'out'}\n")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    for command in (["-m", "cli.main", "validate"], ["-m", "cli.main", "train"], ["-m", "flows.finetune"]):
        out = subprocess.run([sys.executable, *command, str(config)], capture_output=True, text=True, env=env,
                             timeout=120)
        assert out.returncode == 2 and "Traceback" not in out.stderr, (command, out.stderr)
        for expected in ("'template: chatm' is not known; did you mean 'chatml'",
                         "'per_device_train_batch_size' is -2; it must be at least 1",
                         "'quantization_bit: 4' quantizes through bitsandbytes, which needs a CUDA GPU",
                         "'fp16: true' needs a CUDA GPU"):
            assert expected in out.stderr, (command, expected, out.stderr)
        assert "prefect" not in out.stderr.lower() and not (tmp_path / "out").exists()
