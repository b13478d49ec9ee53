"""A flow on a local Ray killed outright, then the same command (part of the fault suite, `make chaos`): minutes of
a 300-step Ray training, so it runs with LLaMA-Factory's examples in `make acceptance`."""

from __future__ import annotations

import json
import time
from pathlib import Path

# The flow on a local Ray killed outright: SIGKILL to the flow's process alone (as the OOM killer or `kill -9 PID`
# sends it; not its process group) after the training's first checkpoint. The Ray it started and its workers end
# with it, so nothing trains on, and the same command resumes to the uninterrupted Ray run's losses, weights and one
# MLflow run. 300 steps, so that on a quiet machine (a few hundredths of a second a step) the kill, which the
# workers notice within half a second, still lands mid-run.
ON_RAY = {"use_ray": True, "ray_num_workers": 2, "eval_dataset": None, "max_steps": 300, "save_steps": 10,
          "per_device_train_batch_size": 2}


def training_processes(root: Path) -> list[str]:
    """The command lines of live training processes of this test's config."""
    lines = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "tuneline.train" in cmdline and str(root) in cmdline:
            lines.append(cmdline)
    return lines


def test_a_flow_killed_on_ray_leaves_nothing_training_and_the_same_command_resumes(chaos, tmp_path,
                                                                                  tiny_model_dir, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    suite = chaos.Suite(tmp_path, tiny_model_dir)
    baseline = suite.baseline(**ON_RAY)
    root = suite.folder("killed")
    config = chaos.tiny_config(root, tiny_model_dir, **ON_RAY)
    flow = chaos.Flow(config, root / "killed.log", chaos.flow_env(root))
    assert flow.wait_until(lambda: bool(chaos.checkpoints(root / "out")), 600), flow.output()[-3000:]
    flow.proc.kill()  # the flow's process alone: not its process group
    flow.proc.wait()
    deadline = time.monotonic() + 30
    while training_processes(root / "out") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert training_processes(root / "out") == [], "a training process outlived the flow"
    killed_at = max(int(p.name.split("-")[1]) for p in chaos.checkpoints(root / "out"))
    assert json.loads((root / "out" / "run.json").read_text())["status"] == "running" and killed_at < 300

    code, output = chaos.run_to_end(config, root, "rerun")
    assert code == 0, output[-3000:]
    run = json.loads((root / "out" / "run.json").read_text())
    assert run["status"] == "complete" and run["resumed_step"] >= killed_at
    assert set(chaos.step_states(output)["build-dataset"]) == {"Cached"}
    assert chaos.tracked(root)[0] == 1
    assert chaos.differences(root, baseline) == []
