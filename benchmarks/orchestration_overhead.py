"""What the flow costs on top of training, and how fast a fully cached re-run is.

    .venv/bin/python benchmarks/orchestration_overhead.py [--steps 300] [--pairs 3]

The same SFT LoRA training of the demo runs three ways, in `--pairs` rounds (each way first in turn, since this
machine's speed drifts within minutes): (a) the bare entry point `python -m tuneline.train CONFIG`, (b) `tuneline
train CONFIG` on Prefect's temporary server (no PREFECT_API_URL), (c) `tuneline train CONFIG` against a running
`prefect server start`. A flow run does more than (a): seven steps, the MLflow run, the tuned model's evaluation,
plots and the model card. Each run's fixed part is its wall time outside the Trainer's loop (`train_runtime`);
the flow's fixed cost is the median, over rounds, of its fixed part less the bare run's of the same round. The
loop's own difference is printed too (noisy: the loop's time varies run to run). A 1-step flow run comes first,
as a user's first run (it creates the stores, tokenizes and scores the base model), and is printed on its own.

Then: fully cached re-runs of (b) and (c), and what Prefect's own start costs: a flow that does nothing, run on a
temporary server and against the running one. Figures are printed, never asserted; benchmarks/README.md keeps
them with their date and machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
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

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NOOP_FLOW = "from prefect import flow\nflow(name='noop')(lambda: None)()\n"


def timed(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def train_runtime(output_dir: Path) -> float:
    return float(json.loads((output_dir / "all_results.json").read_text())["train_runtime"])


@contextlib.contextmanager
def prefect_server(env: dict):
    """A running `prefect server start` on a free port of 127.0.0.1: the environment that uses it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{api}/health", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield {**env, "PREFECT_API_URL": api}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--pairs", type=int, default=3, help="rounds of bare / temporary server / running server")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tuneline-bench-"))
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_HOME": str(root / "prefect")}
    env.pop("PREFECT_API_URL", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as on a user's machine, Python caches what it compiled once
    tuneline = [str(BIN / "tuneline"), "train"]
    model = root / "tiny"
    subprocess.run([str(BIN / "tuneline"), "tiny-model", str(model), "--preset", "demo"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    config = yaml.safe_load((REPO / "examples" / "sft_lora_demo.yaml").read_text())
    config.update(model_name_or_path=str(model), max_steps=args.steps, pipeline_cache_dir=str(root / "cache"),
                  mlflow_tracking_uri=f"sqlite:///{root / 'mlflow.db'}", mlflow_registered_model=None)

    def write(name: str, **changes) -> Path:
        path = root / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**config, "output_dir": str(root / name), **changes}))
        return path

    first = timed([*tuneline, str(write("first", max_steps=1, learning_rate=1e-5))], env)
    with prefect_server(env) as server_env:
        kinds = {"bare": ([str(BIN / "python"), "-m", "tuneline.train"], env), "temporary": (tuneline, env),
                 "server": (tuneline, server_env)}
        runs: dict[str, list[tuple[float, float]]] = {kind: [] for kind in kinds}  # (wall, train_runtime)
        for n in range(args.pairs):
            for kind in list(kinds)[n % 3:] + list(kinds)[:n % 3]:
                command, kind_env = kinds[kind]
                wall = timed([*command, str(write(f"{kind}-{n}"))], kind_env)
                runs[kind].append((wall, train_runtime(root / f"{kind}-{n}")))
                print(f"round {n + 1} {kind:9s} wall {wall:6.1f} s  loop {runs[kind][-1][1]:6.1f} s", flush=True)
        cached = {kind: [timed([*tuneline, str(root / f"{kind}-0.yaml")], kinds[kind][1]) for _ in range(3)]
                  for kind in ("temporary", "server")}
        noop = {kind: [timed([str(BIN / "python"), "-c", NOOP_FLOW], kinds[kind][1]) for _ in range(3)]
                for kind in ("temporary", "server")}

    print(f"\nmachine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"python {platform.python_version()}; {args.steps} steps, {args.pairs} rounds")
    print(f"first run on fresh stores (1 step): {first:.1f} s")
    bare = runs["bare"]
    print(f"bare entry point: wall {statistics.median(w for w, _ in bare):.1f} s, "
          f"outside the loop {statistics.median(w - loop for w, loop in bare):.1f} s")
    for kind, label in (("temporary", "Prefect's temporary server"), ("server", "a running Prefect server")):
        pairs = list(zip(runs[kind], bare, strict=True))
        fixed = statistics.median((w - loop) - (bw - bloop) for (w, loop), (bw, bloop) in pairs)
        loop = statistics.median(loop / bloop - 1 for (_, loop), (_, bloop) in pairs)
        extra = statistics.median(w - bw for (w, _), (bw, _) in pairs)
        print(f"flow on {label}: fixed cost {fixed:+.1f} s, loop {100 * loop:+.1f}% (noisy), total {extra:+.1f} s; "
              f"fully cached re-run {statistics.median(cached[kind]):.1f} s "
              f"({', '.join(f'{t:.1f}' for t in cached[kind])})")
    start = statistics.median(noop["temporary"]) - statistics.median(noop["server"])
    print(f"a flow that does nothing: {statistics.median(noop['temporary']):.1f} s on a temporary server, "
          f"{statistics.median(noop['server']):.1f} s against a running one: Prefect's own start of its temporary "
          f"server costs ~{start:.1f} s a command")


if __name__ == "__main__":
    main()
