"""Where a training's seconds go, step by step: the training child's own code (`tuneline.train`'s stage runner) run in
this process on a config, with and without streaming step metrics to MLflow, as the flow's child does when it finds
MLFLOW_RUN_ID. Prints each of the first steps, the mean of the rest, `train_runtime` and tokens/s.

    python benchmarks/step_times.py CONFIG [--first 5] [--repeats 2]

Written to find the one-off cost at the start of `bench.py`'s sft-vlm pair (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed_run(config_path: Path, output_dir: Path) -> dict:
    from transformers import TrainerCallback

    from tuneline.config import load_config
    from tuneline.data import build_dataset
    from tuneline.train import stage_runner

    steps: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            steps.append(time.perf_counter() - self.start)

    config = load_config(str(config_path), {"output_dir": str(output_dir)})
    result = stage_runner(config.stage)(config, build_dataset(config), [StepClock()])
    metrics = result["metrics"]
    return {"steps": steps, "train_runtime": metrics["train_runtime"],
            "tokens_per_s": metrics["num_input_tokens_seen"] / metrics["train_runtime"]}


CREATE_RUN = """
import sys
from mlflow import MlflowClient
client = MlflowClient(sys.argv[1])
print(client.create_run(client.create_experiment("step_times")).info.run_id)
"""


def in_fresh_process(args: list[str], env: dict) -> str:
    """The last line a fresh interpreter prints: each run pays its own imports, MLflow's included."""
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env={**os.environ, **env}, cwd=REPO)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return done.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--first", type=int, default=5, help="steps shown one by one")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # a child: one timed run into this output_dir
    args = parser.parse_args()
    if args.one:
        print(json.dumps(timed_run(args.config, args.one)))
        return
    with tempfile.TemporaryDirectory() as work:
        uri = f"sqlite:///{Path(work) / 'mlflow.db'}"
        run_id = in_fresh_process(["-c", CREATE_RUN, uri], {})
        print(f"| MLflow step metrics | run | steps 1-{args.first} s | later steps, mean s | train_runtime s | tokens/s |")
        print("|---|---|---|---|---|---|")
        for repeat in range(args.repeats):
            for streaming in (False, True):
                env = {"MLFLOW_RUN_ID": run_id if streaming else "", "MLFLOW_TRACKING_URI": uri if streaming else ""}
                out = json.loads(in_fresh_process([__file__, str(args.config), "--one",
                                                   str(Path(work) / f"out-{repeat}-{streaming}")], env))
                first = ", ".join(f"{s:.2f}" for s in out["steps"][:args.first])
                rest = statistics.mean(out["steps"][args.first:])
                print(f"| {'on' if streaming else 'off'} | {repeat + 1} | {first} | {rest:.3f} | "
                      f"{out['train_runtime']:.2f} | {out['tokens_per_s']:.0f} |", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
