"""What training on a local Ray costs against `accelerate launch`, both with 2 CPU processes over gloo:
`python benchmarks/ray_launch.py [--steps 12] [--repeats 1] [--deepspeed DS_CONFIG]`.

Trains the same tiny-model LoRA run (demo sft data, batch 2 per process) through the command the train step runs
for each launcher (tuneline.pipeline.launch.launch_command), and prints, per launcher: the whole command's wall
time, the start cost (wall time less the trainer's own train_runtime: starting Ray or accelerate, the workers,
imports and model load, the end), and the time per step inside the trainer. Also the cost of `ray.init` alone (a
local Ray of 2 CPUs). With `--deepspeed`, both runs train with that ds_config (ZeRO on DeepSpeed's CPU accelerator).
Figures only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tuneline from this checkout, installed or not
REPO = Path(__file__).resolve().parents[1]


def config_values(model: Path, out: Path, steps: int, **keys) -> dict:
    return {"model_name_or_path": str(model), "stage": "sft", "finetuning_type": "lora", "lora_rank": 4,
            "dataset": "demo_sft", "dataset_dir": str(REPO / "data"), "output_dir": str(out), "max_steps": steps,
            "per_device_train_batch_size": 2, "save_steps": 1000, "logging_steps": 1, "cutoff_len": 64,
            "max_samples": 64, "pipeline_cache_dir": str(out.parent / "cache"), "dataloader_num_workers": 0, **keys}


def timed_launch(name: str, values: dict, dataset: str, root: Path) -> dict:
    from tuneline.config import dump_config, load_config
    from tuneline.pipeline.launch import launch_command

    config = load_config(None, values, check_paths=False)
    cmd = launch_command(config, dump_config(config, root / f"{name}.yaml"), dataset)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    results = json.loads((config.output_dir / "train_results.json").read_text())
    runtime = float(results["train_runtime"])
    return {"launcher": name, "wall_s": wall, "start_s": wall - runtime, "step_s": runtime / values["max_steps"]}


def ray_init_cost() -> float:
    script = ("import time, ray; t = time.perf_counter(); ray.init(num_cpus=2, include_dashboard=False); "
              "print(time.perf_counter() - t); ray.shutdown()")
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--deepspeed", default=None, help="a ds_config JSON both runs train with")
    args = parser.parse_args()
    sharded = {"deepspeed": str(Path(args.deepspeed).absolute())} if args.deepspeed else {}
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.pop("RAY_ADDRESS", None)
    from tuneline.data import build_dataset
    from tuneline.demo.tiny_model import TINY_PRESETS, build_tiny_model

    with tempfile.TemporaryDirectory(prefix="ray-bench-") as scratch:
        root = Path(scratch)
        model = build_tiny_model(root / "model", **TINY_PRESETS["test"])
        dataset = build_dataset(load(config_values(model, root / "unused", args.steps)))["path"]
        print(f"ray.init (a local Ray, 2 CPUs): {ray_init_cost():.1f} s")
        rows = []
        for repeat in range(args.repeats):
            for name, keys in (("accelerate", {"num_processes": 2}), ("ray", {"ray_num_workers": 2})):
                out = root / f"{name}-{repeat}"
                rows.append(timed_launch(name, config_values(model, out, args.steps, **keys, **sharded), dataset, root))
        print(f"{'launcher':<12}{'wall s':>9}{'start s':>9}{'s/step':>9}   ({args.steps} steps, 2 CPU processes"
              f"{', deepspeed ' + Path(args.deepspeed).name if args.deepspeed else ''})")
        for row in rows:
            print(f"{row['launcher']:<12}{row['wall_s']:>9.1f}{row['start_s']:>9.1f}{row['step_s']:>9.3f}")


def load(values: dict):
    from tuneline.config import load_config

    return load_config(None, values, check_paths=False)


if __name__ == "__main__":
    main()
