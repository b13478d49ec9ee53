"""Start the training subprocess with `accelerate launch` and stream its output.

One process on CPU (or `num_processes` CPU processes over gloo), one per GPU with `--multi_gpu`, or what an
accelerate config file says (FSDP, several machines) from `accelerate_config`. DeepSpeed comes from `deepspeed`
(a ds_config JSON): accelerate's DeepSpeed launcher starts the processes and transformers sets DeepSpeed up inside
the child (tuneline.deepspeed_setup says what else it takes, on CPU too).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path

from tuneline.deepspeed_setup import launch_environment
from tuneline.devices import gpu_count
from tuneline.errors import UserError
from tuneline.training_contract import DIE_WITH_PARENT_ENV, ERROR_PREFIX, die_with_parent

TAIL_LINES = 40
ACCELERATE_LAUNCH = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch"]  # `accelerate launch`


class TrainingFailed(UserError):
    """The training subprocess exited with an error; carries its last lines."""

    def __init__(self, returncode: int, tail: list[str]):
        self.returncode = returncode
        self.tail = tail
        super().__init__(f"training exited with code {returncode}:\n" + "\n".join(error_lines(tail)),
                         title="training failed")


def error_lines(tail: list[str]) -> list[str]:
    """The child's own error message when it printed one, else its last traceback, else its last lines."""
    for i in range(len(tail) - 1, -1, -1):
        if ERROR_PREFIX in tail[i]:
            message = tail[i:i + 12]
            ends = [n for n, line in enumerate(message) if line.startswith("Traceback")]
            return message[:ends[0]] if ends else message  # not the launcher's own traceback after it
    starts = [i for i, line in enumerate(tail) if line.startswith("Traceback")]
    return tail[starts[-1]:] if starts else tail[-15:]


def launch_command(config, config_path: Path | str, dataset_path: str | None = None) -> list[str]:
    """`accelerate launch ... -m tuneline.train CONFIG [--dataset PATH]` for this config and machine."""
    dataset = ["--dataset", str(dataset_path)] if dataset_path else []
    return [*launcher(config), "-m", "tuneline.train", str(config_path), *dataset]


def launcher(config) -> list[str]:
    """`accelerate launch` with this config's processes and threads on this machine: what precedes `-m`."""
    gpus = gpu_count()
    use_cpu = not gpus or bool(config.training.get("use_cpu"))
    processes = config.pipeline.num_processes or (1 if use_cpu else gpus)
    deepspeed = bool(config.training.get("deepspeed")) and not config.pipeline.accelerate_config
    if deepspeed:
        cmd = launch_environment(use_cpu)
    else:  # accelerate starts N CPU processes (gloo) only with --multi_gpu and ACCELERATE_USE_CPU in its environment
        cmd = ["env", "ACCELERATE_USE_CPU=true"] if use_cpu else []
    cmd += ACCELERATE_LAUNCH
    if config.pipeline.accelerate_config:
        cmd += ["--config_file", str(config.pipeline.accelerate_config)]
        if config.pipeline.num_processes:
            cmd += ["--num_processes", str(processes)]
    else:
        cmd += ["--num_machines", "1", "--num_processes", str(processes), "--mixed_precision", "no",
                "--dynamo_backend", "no"]
        if deepspeed:  # its launcher sets the rank variables DeepSpeed needs, one process too; on a free port, so
            cmd += ["--use_deepspeed", "--main_process_port", "0"]  # that trainings side by side do not collide
        elif processes > 1:
            cmd += ["--multi_gpu"]
    if use_cpu:
        cmd += ["--num_cpu_threads_per_process", str(cpu_threads_per_process(processes))]
    return cmd


def cpu_threads_per_process(processes: int) -> int:
    """OMP_NUM_THREADS when the user set it, else this machine's usable cores shared among the processes.

    Left to itself `accelerate launch` gives each CPU process OMP_NUM_THREADS=1 unless started with --cpu and
    physical cores to spare, so training would run on one thread.
    """
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, processes))


def run_streaming(cmd: list[str], env: dict[str, str] | None, on_line: Callable[[str], None]) -> None:
    """Run cmd, pass each output line (stdout and stderr) to on_line; raise TrainingFailed on a non-zero exit.

    On Linux the process is killed if this one dies, so that no orphan keeps training.
    """
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1", DIE_WITH_PARENT_ENV: "1"}
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", bufsize=1, preexec_fn=die_with_parent) as proc:
        try:
            for raw in proc.stdout:
                for line in raw.rstrip("\n").split("\r"):
                    if line.strip():
                        tail.append(line)
                        on_line(line)
        except BaseException:
            proc.kill()
            raise
        returncode = proc.wait()
    if returncode != 0:
        raise TrainingFailed(returncode, list(tail))
