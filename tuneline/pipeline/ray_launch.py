"""The training child on Ray: Ray Train's TorchTrainer places `ray_num_workers` workers and restarts them.

    python -m tuneline.pipeline.ray_launch CONFIG --ray SETTINGS_JSON [--dataset PATH]

The train step runs this driver where it would run `accelerate launch` (tuneline.pipeline.launch.launch_command),
and follows it the same way: its lines (Ray forwards the workers' lines to it), trainer_log.jsonl for progress, its
exit code. Each worker runs `accelerate launch ... -m tuneline.train` as one machine of `ray_num_workers` (one process
each, meeting where rank 0 says), so the child gets what accelerate's launch gives it without Ray, DeepSpeed ZeRO and
an accelerate config's FSDP plugin included, and the lock, run.json, the atomic checkpoints, the exact resume and the
one MLflow run are the child's own, unchanged. Ray's part is placement and restarts: a worker lost mid-run fails the
group, Ray starts it again (`ray_max_failures` times) and every child resumes from the last complete checkpoint in
output_dir. Ray Train's own checkpoint reporting is not used, since the children's checkpoints are already on the
storage every worker reaches.

Without `ray_address` (or RAY_ADDRESS, or an `address` in ray_init_kwargs) a local Ray starts inside this driver and
stops with it: killed, its processes die with it (Ray's fate sharing), and so do the children (die-with-parent).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from tuneline.config.ray_keys import RaySettings
from tuneline.errors import UserError
from tuneline.pipeline.launch import launcher
from tuneline.runtime.contract import DIE_WITH_PARENT_ENV, ERROR_PREFIX, die_with_parent, die_with_parent_if_asked
from tuneline.runtime.ray_cluster import refuse_unreachable, unreachable

CHILD_FAILED = "[tuneline child exit "  # how a worker's failure names its child's exit code and error line
CHILD_FAILURE = re.compile(re.escape(CHILD_FAILED) + r"(-?\d+)\] (.*?)(?:\nTraceback|\Z)", re.S)
# What the flow's side puts in the child's environment, carried to workers on other machines (a local Ray's workers
# inherit this driver's whole environment).
CARRIED_PREFIXES = ("TUNELINE_", "MLFLOW_", "HF_", "DS_", "OMP_NUM_THREADS", "TORCH_EXTENSIONS_DIR")


def worker_resources(settings: RaySettings, use_cpu: bool) -> tuple[dict[str, float], bool]:
    """Each worker's resources and whether it takes a GPU. On CPU (`use_cpu`, or a local Ray on a machine without
    GPUs, as tuneline trains anywhere else) a GPU asked for in resources_per_worker is left out."""
    resources = dict(settings.resources_per_worker or {})
    if use_cpu:
        resources.pop("GPU", None)
    resources = {k: v for k, v in resources.items() if v} or {"CPU": 1}  # Ray's own default: one CPU a worker
    return resources, bool(resources.get("GPU"))


def workers_use_gpus(config) -> bool:
    """Whether the workers train on GPUs: resources_per_worker gives each one, and neither `use_cpu` nor a local
    Ray on a machine without GPUs (where tuneline trains on CPU, as it does without Ray) says otherwise."""
    from tuneline.runtime.devices import gpu_count

    settings = config.ray
    use_cpu = bool(config.training.get("use_cpu")) or (settings.local and not gpu_count())
    return worker_resources(settings, use_cpu)[1]


def start_ray(settings: RaySettings, workers_cpus: float, on_line=print) -> None:
    """Join the named cluster, or start a local Ray sized for the workers; a cluster out of reach is a UserError."""
    import ray

    kwargs = {"log_to_driver": True, **settings.init_kwargs}
    if settings.local:
        kwargs.setdefault("include_dashboard", False)
        kwargs.setdefault("num_cpus", max(len(os.sched_getaffinity(0)), int(workers_cpus + 0.999)))
        os.environ.pop("RAY_ADDRESS", None)
        on_line(f"starting a local Ray for {settings.num_workers} workers (no ray_address: it stops with the run)")
    else:
        kwargs.setdefault("address", settings.address)
        on_line(f"joining the Ray cluster at {kwargs['address']}")
        refuse_unreachable(kwargs["address"])
    try:
        ray.init(**kwargs)
    except ValueError as err:  # ray.init's own checks of what it was given
        raise UserError(f"'ray_init_kwargs: {settings.init_kwargs}': ray.init refused them: {err}") from None
    except (ConnectionError, TimeoutError, RuntimeError) as err:
        why = str(err).splitlines()[0][:200]
        if not settings.local:  # it answered on its port: Ray's token authentication is the usual reason
            why += ("; a cluster with token authentication needs RAY_AUTH_MODE=token here and its token (RAY_AUTH_TOKEN "
                    "or ~/.ray/auth_token, as `ray get-auth-token` prints it on the head)")
        raise unreachable(kwargs.get("address") or "this machine", why) from None


def build_trainer(config, config_path: str, dataset: str | None, settings: RaySettings, use_cpu: bool):
    """The TorchTrainer whose workers each run one training child; its failures restart the group."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    resources, use_gpu = worker_resources(settings, use_cpu)
    storage = settings.storage_path or str(Path(config.pipeline.pipeline_cache_dir, "ray").absolute())
    name = settings.run_name or f"tuneline-{Path(config.output_dir).absolute().name}"
    env = {k: v for k, v in os.environ.items() if k.startswith(CARRIED_PREFIXES)}
    loop = {"config": str(Path(config_path).absolute()), "run": config, "dataset": dataset, "cwd": os.getcwd(),
            "env": env, "master_addr": settings.master_addr, "master_port": settings.master_port, "use_cpu": not use_gpu,
            "threads": max(1, int(resources.get("CPU", 1))), "driver_pid": os.getpid() if settings.local else None}
    return TorchTrainer(
        run_child, train_loop_config=loop, torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=settings.num_workers, use_gpu=use_gpu,
                                     resources_per_worker=resources, placement_strategy=settings.placement_strategy),
        run_config=RunConfig(name=name, storage_path=storage,
                             failure_config=FailureConfig(max_failures=settings.max_failures)))


def run_child(loop: dict) -> None:
    """In each Ray worker: `accelerate launch ... -m tuneline.train`, this worker being machine `rank` of
    `ray_num_workers` machines of one process each, its lines forwarded to the driver.

    The child is so started by the launch it gets without Ray, with the environment that launch gives it:
    DeepSpeed's (`deepspeed`), an accelerate config's FSDP plugin (`accelerate_config`), FP8, the rendezvous. Rank 0
    names where the launches meet (master_addr / master_port, else its own address and a free port): a second
    rendezvous beside Ray's own process group, which the children do not share."""
    import ray
    from ray.train.collective import broadcast_from_rank_zero

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    meeting = None
    if rank == 0:
        meeting = (loop["master_addr"] or ray.util.get_node_ip_address(), loop["master_port"] or free_port())
    addr, port = broadcast_from_rank_zero(meeting)
    if not Path(loop["cwd"]).is_dir():
        raise UserError(f"the flow's working folder {loop['cwd']} is not on the machine of Ray worker {rank}: run the "
                        "flow from a folder every machine mounts at that path")
    os.environ.update(loop["env"])  # this worker's process runs nothing but this launch
    os.environ.setdefault("OMP_NUM_THREADS", str(loop["threads"]))
    env = {**os.environ, **own_gpus(loop["use_cpu"]), DIE_WITH_PARENT_ENV: "1", "PYTHONUNBUFFERED": "1"}
    cmd = [*worker_launcher(loop["run"], loop["use_cpu"], rank, world, addr, port), "-m", "tuneline.train",
           loop["config"], *(["--dataset", loop["dataset"]] if loop["dataset"] else [])]
    tail: deque[str] = deque(maxlen=40)
    with subprocess.Popen(cmd, cwd=loop["cwd"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", bufsize=1, preexec_fn=die_with_parent) as proc:
        if loop["driver_pid"]:
            threading.Thread(target=end_with_driver, args=(loop["driver_pid"], proc), daemon=True).start()
        for line in proc.stdout:
            print(line, end="", flush=True)
            tail.append(line.rstrip("\n"))
        code = proc.wait()
    if code != 0:
        said = [i for i, line in enumerate(tail) if line.startswith(ERROR_PREFIX)]
        if said:  # the child's own line, which it ends with exit code 2; its launcher's exit code is its own
            code = UserError.exit_code
        why = "\n".join(list(tail)[said[-1]:][:12])[len(ERROR_PREFIX):] if said else f"worker {rank}"
        raise RuntimeError(f"{CHILD_FAILED}{code}] {why}")


def worker_launcher(config, use_cpu: bool, rank: int, world: int, addr: str, port: int) -> list[str]:
    """`accelerate launch` for one Ray worker: machine `rank` of `world`, one process, meeting at addr:port. The
    run config's num_processes and machines never reach here (refused beside Ray: the workers count both); an
    accelerate config file's are replaced (LLaMA-Factory's fsdp_config_multiple_nodes.yaml names 2 machines)."""
    pipe = dataclasses.replace(config.pipeline, num_processes=1, num_machines=world, machine_rank=rank,
                               main_process_ip=addr, main_process_port=port)
    alone = ["--num_machines", "1", "--machine_rank", "0"] if world == 1 and pipe.accelerate_config else []
    return launcher(dataclasses.replace(config, pipeline=pipe), use_cpu=use_cpu) + alone


def own_gpus(use_cpu: bool) -> dict[str, str]:
    """Ray Train shows a worker every GPU of its machine's workers, and the one process of its launch takes the
    first it sees (LOCAL_RANK 0): it is shown its own alone."""
    import ray

    ids = [] if use_cpu else ray.get_gpu_ids()
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in ids)} if ids else {}


def end_with_driver(pid: int, proc: subprocess.Popen) -> None:
    """A local Ray's workers outlive a driver killed outright (its cluster goes, nothing stops them), and a child
    would train on, holding output_dir's lock: each worker watches its driver and ends its child and itself."""
    while proc.poll() is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            proc.kill()
            os._exit(1)
        time.sleep(0.5)


def failure_of(err) -> tuple[int, str]:
    """The exit code and error line a failed fit ends this driver with: the children's own (exit code 2 with their
    `tuneline: error:` line for what the user can fix), else the first line of Ray's."""
    for failure in (getattr(err, "worker_failures", None) or {}).values():
        if found := CHILD_FAILURE.search(str(failure)):
            code = int(found.group(1))
            return (code if code == UserError.exit_code else 1), found.group(2).strip()
    return 1, str(err).strip().splitlines()[-1][:300] if str(err).strip() else type(err).__name__


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    """Start (or join) Ray, fit, stop the local Ray: exit 0 when every worker's child ended cleanly."""
    parser = argparse.ArgumentParser(prog="python -m tuneline.pipeline.ray_launch", description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--ray", required=True, help="the run's Ray settings, as RaySettings.to_json() writes them")
    parser.add_argument("--dataset", default=None)
    args = parser.parse_args(argv)
    die_with_parent_if_asked()
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # the flow's log shows the workers' lines as text, not colours
    try:
        from tuneline.config import load_config

        config = load_config(args.config, check_paths=False)
        settings = config.ray = RaySettings.from_json(args.ray)
        use_cpu = not workers_use_gpus(config)
        resources, _ = worker_resources(settings, use_cpu)
        start_ray(settings, resources.get("CPU", 1) * settings.num_workers)
        import ray
        from ray.train import TrainingFailedError

        try:
            build_trainer(config, args.config, args.dataset, settings, use_cpu).fit()
        except TrainingFailedError as err:
            code, why = failure_of(err)
            print(f"{ERROR_PREFIX}{why}" if code == UserError.exit_code else
                  f"training on Ray failed after {settings.max_failures} restarts ('ray_max_failures'): {why}",
                  file=sys.stderr, flush=True)
            return code
        finally:
            ray.shutdown()
    except UserError as err:  # one `tuneline: error:` line the train step shows, as the training child does
        print(ERROR_PREFIX + str(err).replace("\n", "\n  "), file=sys.stderr, flush=True)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
