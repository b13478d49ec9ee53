"""Start the training subprocess with `accelerate launch` and stream its output.

One process on CPU (or `num_processes` CPU processes over gloo), one per GPU with `--multi_gpu`, or what an
accelerate config file says (FSDP) from `accelerate_config`; with `num_machines` above 1, the same on each machine,
meeting at `main_process_ip` (tuneline.pipeline.node launches the machines other than the main one). DeepSpeed comes from `deepspeed`
(a ds_config JSON): accelerate's DeepSpeed launcher starts the processes and transformers sets DeepSpeed up inside
the child (tuneline.runtime.deepspeed_setup says what else it takes, on CPU too).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path

from tuneline.errors import UserError
from tuneline.runtime.contract import DIE_WITH_PARENT_ENV, ERROR_PREFIX, die_with_parent
from tuneline.runtime.deepspeed_setup import launch_environment
from tuneline.runtime.devices import gpu_count
from tuneline.runtime.fp8_launch import fp8_launch_flags

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


def launch_command(config, config_path: Path | str, dataset_path: str | None = None,
                   other_machine: bool = False) -> list[str]:
    """`accelerate launch ... -m tuneline.train CONFIG [--dataset PATH]` for this config and machine.

    Only the main machine (machine_rank 0) runs the flow; the others launch through tuneline.pipeline.node
    (`other_machine`), so a flow started with another rank is refused before it builds or logs anything twice."""
    if config.pipeline.machine_rank != 0 and not other_machine:
        raise UserError(f"'machine_rank: {config.pipeline.machine_rank}': the flow (`tuneline train`) runs on the main "
                        "machine only (machine_rank 0); start the others with `tuneline train-node CONFIG "
                        "--machine-rank N`")
    dataset = ["--dataset", str(dataset_path)] if dataset_path else []
    if config.ray is not None:  # Ray places the workers, each launching the same child (tuneline.pipeline.ray_launch)
        return [sys.executable, "-m", "tuneline.pipeline.ray_launch", str(config_path), "--ray", config.ray.to_json(),
                *dataset]
    return [*launcher(config), "-m", "tuneline.train", str(config_path), *dataset]


DEFAULT_PORT = 29500  # accelerate's and torch's, where the machines meet unless main_process_port says otherwise


def launcher(config, use_cpu: bool | None = None) -> list[str]:
    """`accelerate launch` with this config's processes and threads on this machine: what precedes `-m`.

    `num_processes` counts one machine's processes; accelerate's `--num_processes` is the total over
    `num_machines` (it starts total / machines on each). `use_cpu` when the caller knows better than this
    machine's GPU count (a Ray worker, told by its driver)."""
    gpus = gpu_count()
    pipe = config.pipeline
    if use_cpu is None:
        use_cpu = not gpus or bool(config.training.get("use_cpu"))
    per_machine = pipe.num_processes or (1 if use_cpu else gpus)
    processes = per_machine * pipe.num_machines
    deepspeed = bool(config.training.get("deepspeed")) and not pipe.accelerate_config
    if deepspeed:
        cmd = launch_environment(use_cpu)
    else:  # accelerate starts N CPU processes (gloo) only with --multi_gpu and ACCELERATE_USE_CPU in its environment
        cmd = ["env", "ACCELERATE_USE_CPU=true"] if use_cpu else []
    cmd += ACCELERATE_LAUNCH
    if pipe.accelerate_config:
        cmd += ["--config_file", str(pipe.accelerate_config)]
        if pipe.num_processes:
            cmd += ["--num_processes", str(processes)]
        cmd += machine_flags(pipe) + (fp8_launch_flags(config) if config.finetuning.fp8 else [])
        if pipe.num_machines <= 1 and not _sets_port(pipe.accelerate_config):
            cmd += ["--main_process_port", "0"]  # as without a file: a free port, unless the file names one
    else:
        cmd += ["--num_processes", str(processes), *fp8_launch_flags(config), "--dynamo_backend", "no"]
        cmd += machine_flags(pipe) or ["--num_machines", "1"]
        # One machine: its processes meet on a free port, so trainings side by side do not collide on 29500
        alone = [] if pipe.num_machines > 1 else ["--main_process_port", "0"]
        if deepspeed:  # its launcher sets the rank variables DeepSpeed needs, one process too
            cmd += ["--use_deepspeed", *alone]
        elif processes > 1:
            cmd += ["--multi_gpu", *alone]
    if use_cpu:
        cmd += ["--num_cpu_threads_per_process", str(cpu_threads_per_process(per_machine))]
    return cmd


def _sets_port(accelerate_config) -> bool:
    """Whether an accelerate config file names where its processes meet (its port, or machines beyond this one)."""
    import yaml

    values = yaml.safe_load(Path(accelerate_config).read_text()) or {}
    return "main_process_port" in values or int(values.get("num_machines") or 1) > 1


def machine_flags(pipe) -> list[str]:
    """With several machines: their number, this one's rank, where they meet. Every machine runs its own launch
    (torchrun's static rendezvous at main_process_ip:port), DeepSpeed too ('standard' launcher: no ssh, no
    hostfile). None for one machine: an accelerate_config's own values then stand."""
    if pipe.num_machines <= 1:
        return []
    return ["--num_machines", str(pipe.num_machines), "--machine_rank", str(pipe.machine_rank),
            "--main_process_ip", str(pipe.main_process_ip),
            "--main_process_port", str(pipe.main_process_port or DEFAULT_PORT),
            "--deepspeed_multinode_launcher", "standard"]


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
