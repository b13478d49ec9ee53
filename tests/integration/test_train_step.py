"""The flow's side of training (tuneline.pipeline.train_step, tuneline.pipeline.launch): the device count that
picks the launch, and the progress the train step reports while the child trains."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tuneline.pipeline.follow_log import TrainerLogReader

COUNT_AND_IMPORTS = ("import sys; from tuneline.runtime.devices import gpu_count; "
                     "print(gpu_count(), 'torch' in sys.modules)")


def _no_cuda_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    return {**env, **extra}


def test_gpu_count_needs_no_torch_import():
    """The flow's process counts devices without importing torch; the count is torch's all the same."""
    import torch

    out = subprocess.run([sys.executable, "-c", COUNT_AND_IMPORTS], env=_no_cuda_env(), capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == [str(torch.cuda.device_count()), "False"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="loads a stand-in ELF library")
def test_gpu_count_reads_nvml_and_the_launch_follows_it(tmp_path, tiny_model_dir):
    """A stand-in libnvidia-ml.so.1 reporting 3 devices (there is no GPU here to count): one process per GPU."""
    source = tmp_path / "nvml.c"
    source.write_text(textwrap.dedent("""
        int nvmlInit_v2(void) { return 0; }
        int nvmlDeviceGetCount_v2(unsigned int *count) { *count = 3; return 0; }
        int nvmlShutdown(void) { return 0; }
    """))
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler, "a C compiler builds the stand-in NVML library"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(tmp_path / "libnvidia-ml.so.1"), str(source)], check=True)
    script = textwrap.dedent(f"""
        import json, sys
        from tuneline.config import load_config
        from tuneline.runtime.devices import gpu_count
        from tuneline.pipeline.launch import launch_command
        config = load_config(None, {{"model_name_or_path": {str(tiny_model_dir)!r}, "stage": "sft", "dataset": "demo_sft",
                               "dataset_dir": "data", "template": "chatml", "output_dir": "out"}}, check_paths=False)
        print(json.dumps([gpu_count(), launch_command(config, "c.yaml"), "torch" in sys.modules]))
    """)
    env = _no_cuda_env(LD_LIBRARY_PATH=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    count, cmd, imported = json.loads(done.stdout)
    assert count == 3 and not imported
    assert "--multi_gpu" in cmd and cmd[cmd.index("--num_processes") + 1] == "3" and "env" not in cmd


def test_trainer_log_is_handed_over_at_most_every_interval(tmp_path):
    """The train step hands on the new trainer_log entries (the newest as progress) at most every interval: not
    one API call per logging step, and no entry lost in between."""
    log = tmp_path / "trainer_log.jsonl"
    now = [100.0]
    reader = TrainerLogReader(log, interval_s=5.0, clock=lambda: now[0])
    assert reader.due() == []  # no log yet

    def append(*steps: int, tail: str = "") -> None:
        with log.open("a") as handle:
            handle.write("".join(json.dumps({"current_steps": s, "percentage": s}) + "\n" for s in steps) + tail)

    def steps(entries: list[dict]) -> list[int]:
        return [entry["current_steps"] for entry in entries]

    append(1, 2)
    assert steps(reader.due()) == [1, 2]  # the first hand-over comes at once
    append(3, 4)
    now[0] += 4.9
    assert reader.due() == []  # too soon: nothing sent, nothing lost either
    append(5, tail='{"current_steps": 6, "perc')  # the child is halfway through writing step 6
    now[0] += 0.1
    assert steps(reader.due()) == [3, 4, 5]  # the whole entries
    now[0] += 10
    assert reader.due() == []  # the log did not grow
    append(tail='entage": 6}\n')
    assert steps(reader.due()) == [6]


def test_a_resumed_childs_log_is_read_from_its_start_and_the_killed_ones_tail_never(tmp_path):
    """A resuming child cuts trainer_log.jsonl back to its checkpoint (a new file renamed over the old one): the
    reader passes over the file of the killed start and reads the cut one from the top, also where it grew past
    the old file's length before the reader looked."""
    from tuneline.train.trainer_log import truncate_log

    log = tmp_path / "trainer_log.jsonl"
    log.write_text("".join(json.dumps({"current_steps": s, "loss": 1.0 / s}) + "\n" for s in range(1, 8)))
    reader = TrainerLogReader(log, interval_s=0.0, skip_existing=True)
    fresh = TrainerLogReader(log, interval_s=0.0)
    assert [e["current_steps"] for e in fresh.new_entries()] == list(range(1, 8))
    assert reader.new_entries() == []  # steps 6 and 7 of the killed start: trained again after the resume
    truncate_log(log, 5)
    with log.open("a") as handle:  # the resumed child's steps, longer than what was cut
        handle.write("".join(json.dumps({"current_steps": s, "loss": 2.0 / s, "pad": "x" * 40}) + "\n"
                             for s in range(6, 10)))
    for follower in (reader, fresh):
        entries = follower.new_entries()
        assert [e["current_steps"] for e in entries] == list(range(1, 10)), entries
        assert entries[5]["loss"] == 2.0 / 6  # step 6 as trained again


def test_only_a_crashed_training_is_retried(tmp_path):
    """Real processes, started as the train step starts its training: killed by a signal (as the out-of-memory
    killer does), directly and behind `accelerate launch`, is a crash; a Python error is not (the same code fails
    the same way), nor is a user's error the child reports."""
    from tuneline.pipeline.launch import ACCELERATE_LAUNCH, TrainingFailed, run_streaming
    from tuneline.pipeline.train_step import worth_retrying

    killed = tmp_path / "killed.py"
    killed.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    launched = [*ACCELERATE_LAUNCH, "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no",
                "--dynamo_backend", "no"]
    cases = {
        "killed": ([sys.executable, str(killed)], True),
        "killed behind accelerate launch": ([*launched, str(killed)], True),
        "a bug": ([sys.executable, "-c", "raise RuntimeError('a bug')"], False),
        "a user's error": ([sys.executable, "-c", "import sys; print('tuneline: error: bad key'); sys.exit(2)"], False),
    }
    for name, (cmd, retried) in cases.items():
        with pytest.raises(TrainingFailed) as failed:
            run_streaming(cmd, None, lambda line: None)
        assert worth_retrying(failed.value) is retried, (name, failed.value.tail[-3:])
    assert worth_retrying(ValueError("raised in the flow's own process")) is False
