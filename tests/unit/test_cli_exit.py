"""The `tuneline` console command's quick exit: exit handlers run, output is flushed, the code is kept."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import atexit, sys, threading, time
from flows import cli
atexit.register(lambda: open({marker!r}, "w").write("exit handler ran"))
if {worker}:
    threading.Thread(target=lambda: (time.sleep(1), open({worker_marker!r}, "w").write("done"))).start()
sys.stdout.write("partial line without newline")
cli.run({argv!r})
print("not reached")
"""


@pytest.mark.parametrize("worker", [False, True])
def test_run_exits_with_mains_code_after_exit_handlers_and_flushes(tmp_path, worker):
    marker, worker_marker = tmp_path / "atexit", tmp_path / "worker"
    argv = ["validate", str(tmp_path / "missing.yaml")]  # a user error: exit code 2, one message
    script = SCRIPT.format(marker=str(marker), worker=worker, worker_marker=str(worker_marker), argv=argv)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stdout == "partial line without newline"  # flushed, and nothing after run()
    assert "missing.yaml" in out.stderr and "Traceback" not in out.stderr
    assert marker.read_text() == "exit handler ran"
    assert worker_marker.exists() == worker  # a working non-daemon thread is waited for, as a normal exit does
