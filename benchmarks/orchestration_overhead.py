"""What the flow costs on top of training, and how fast a fully cached re-run is.

    .venv/bin/python benchmarks/orchestration_overhead.py [--steps 200]

Runs the same SFT LoRA training (a) through the bare entry point `python -m tuneline.train`, (a') the same
through `accelerate launch` as the flow's train step does, and (b) through `tuneline train` (the Prefect flow
on the ephemeral API, with evaluation, plots and model card), then (c) the same flow command again, which must
be a full cache hit. A 1-step flow run comes first, as a user's first run: it creates the MLflow and Prefect
databases, tokenizes and scores the base model, so (b) is the steady state of retraining (only train and what
follows it run) and the one-off cost is printed on its own line. Prints the wall times, each run's
training-loop time (the Trainer's train_runtime), the flow's extra share, and the extra once the evaluation tasks (work the bare run does not do) are taken out, read
from Prefect's own task-run records. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from tuneline.config import load_config
from tuneline.train.launch import launch_command

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def timed(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1500, help="training steps (1500: about 2-3 minutes)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tuneline-bench-"))
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_HOME": str(root / "prefect")}
    model = root / "tiny"
    subprocess.run([BIN / "tuneline", "tiny-model", str(model), "--preset", "demo"], check=True, env=env)
    config = yaml.safe_load((REPO / "examples" / "sft_lora_demo.yaml").read_text())
    config.update(model_name_or_path=str(model), max_steps=args.steps, pipeline_cache_dir=str(root / "cache"),
                  mlflow_tracking_uri=f"sqlite:///{root / 'mlflow.db'}", mlflow_registered_model=None)

    first = dict(config, output_dir=str(root / "first"), max_steps=1, learning_rate=1e-5)
    (root / "first.yaml").write_text(yaml.safe_dump(first))  # creates the stores once, as a user's first run does
    t_first = timed([str(BIN / "tuneline"), "train", str(root / "first.yaml")], env)
    evaluation_before = task_seconds(env, "evaluate")

    bare = dict(config, output_dir=str(root / "bare"))
    (root / "bare.yaml").write_text(yaml.safe_dump(bare))
    subprocess.run([BIN / "python", "-c", "from tuneline.config import load_config; from tuneline.data import "
                    f"build_dataset; build_dataset(load_config('{root / 'bare.yaml'}'))"], check=True, env=env,
                   cwd=REPO)  # tokenize once so both timings start from a warm dataset cache
    t_bare = timed([str(BIN / "python"), "-m", "tuneline.train", str(root / "bare.yaml")], env)
    launched = dict(config, output_dir=str(root / "launched"))  # the same, through `accelerate launch` as `train` does
    (root / "launched.yaml").write_text(yaml.safe_dump(launched))
    t_launched = timed(launch_command(load_config(root / "launched.yaml"), root / "launched.yaml"), env)

    flow = dict(config, output_dir=str(root / "flow"))
    (root / "flow.yaml").write_text(yaml.safe_dump(flow))
    t_flow = timed([str(BIN / "tuneline"), "train", str(root / "flow.yaml")], env)
    evaluation = task_seconds(env, "evaluate") - evaluation_before  # the tuned model's; the base one was cached
    cached = [timed([str(BIN / "tuneline"), "train", str(root / "flow.yaml")], env) for _ in range(3)]

    print(f"first run on fresh stores (1 step): {t_first:.1f} s   (creates the MLflow and Prefect databases, "
          "tokenizes, scores the base model; paid once)")
    print(f"training steps:                 {args.steps}")
    print(f"bare entry point:               {t_bare:8.1f} s   (of which training {train_runtime(root / 'bare'):.1f} s)")
    print(f"the same via accelerate launch: {t_launched:8.1f} s   (of which training "
          f"{train_runtime(root / 'launched'):.1f} s)")
    print(f"flow (7 steps, ephemeral API):  {t_flow:8.1f} s   extra {t_flow - t_bare:+.1f} s "
          f"({100 * (t_flow - t_bare) / t_bare:+.1f}%; includes the tuned model's evaluation, plots, card)")
    print(f"  training inside the flow:     {train_runtime(root / 'flow'):8.1f} s")
    t_orch = t_flow - evaluation
    print(f"  of which evaluate:            {evaluation:8.1f} s   flow without it: {t_orch:.1f} s, extra "
          f"{t_orch - t_bare:+.1f} s ({100 * (t_orch - t_bare) / t_bare:+.1f}%)")
    print(f"flow again, fully cached:       {statistics.median(cached):8.1f} s   median of "
          f"{', '.join(f'{t:.1f}' for t in cached)} s (no PREFECT_API_URL: a temporary server each time)")
    first, second = cached_with_server(env, root)
    print(f"the same against a running `prefect server start`: {first:.1f} s (first contact), {second:.1f} s")


def train_runtime(output_dir: Path) -> float:
    """The Trainer's own train_runtime: the training loop alone, without process start or model loading."""
    return float(json.loads((output_dir / "all_results.json").read_text())["train_runtime"])


def cached_with_server(env: dict, root: Path) -> tuple[float, float]:
    """The cached re-run with PREFECT_API_URL pointing at a server that is already up, as in production."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"{api}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        with_server = {**env, "PREFECT_API_URL": api}
        cmd = [str(BIN / "tuneline"), "train", str(root / "flow.yaml")]
        return timed(cmd, with_server), timed(cmd, with_server)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def task_seconds(env: dict, name: str) -> float:
    """Total run time of the completed task runs called `name`, from the benchmark's own Prefect database."""
    script = (
        "import asyncio\nfrom prefect.client.orchestration import get_client\n"
        "from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName, TaskRunFilterState, "
        "TaskRunFilterStateName\n"
        "async def main():\n"
        "    async with get_client() as client:\n"
        f"        runs = await client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_={name!r}),"
        " state=TaskRunFilterState(name=TaskRunFilterStateName(any_=['Completed']))))\n"
        "    print(sum(r.total_run_time.total_seconds() for r in runs))\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run([str(BIN / "python"), "-c", script], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
