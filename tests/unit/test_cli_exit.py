"""The `tuneline` command: a user's mistake ends in one message and exit code 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys


def test_a_missing_config_is_one_message_and_exit_code_2(tmp_path):
    for command in (["-m", "flows.cli", "validate"], ["-m", "flows.cli", "train"], ["-m", "flows.finetune"]):
        out = subprocess.run([sys.executable, *command, str(tmp_path / "missing.yaml")], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 2, (command, out.stderr)
        assert "missing.yaml" in out.stderr and "Traceback" not in out.stderr, (command, out.stderr)
        assert "prefect" not in out.stderr.lower(), "refused before any flow run starts"
