"""DeepSpeed ZeRO on CPU against a plain run: `python benchmarks/deepspeed_cpu.py [--steps 4] [--configs ds_z2_config
ds_z3_config] [--work DIR]`.

The tiny model (the tests' preset) trains full-parameter sft on the demo data through tuneline's own launch command
(`accelerate launch ... -m tuneline.train`): once plain on one process, then with each of LLaMA-Factory's ds_config
files from examples/deepspeed/ on one and two processes (2 x 2 rows against 1 x 4: the same global batches). Runs
one after another, so each run's wall and CPU seconds (its processes' user + system time) are its own. Prints them
with the losses, the largest relative loss difference from the plain run and the largest absolute weight
difference of the saved model. Figures only: nothing is asserted (tests/integration/train/test_deepspeed.py asserts).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {"stage": "sft", "finetuning_type": "full", "dataset": "demo_sft", "dataset_dir": str(REPO / "data"),
            "per_device_train_batch_size": 4, "max_samples": 16, "cutoff_len": 64, "learning_rate": 5e-3,
            "lr_scheduler_type": "constant", "logging_steps": 1, "seed": 7, "dataloader_num_workers": 0}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def train(work: Path, name: str, dataset: Path, steps: int, **keys) -> dict:
    import yaml

    from tuneline.config import load_config
    from tuneline.pipeline.launch import launch_command, run_streaming

    out = work / name
    values = {**SETTINGS, "model_name_or_path": str(work / "model"), "output_dir": str(out), "max_steps": steps,
              "save_steps": steps, "pipeline_cache_dir": str(work / "cache"), **keys}
    config = work / f"{name}.yaml"
    config.write_text(yaml.safe_dump(values))
    wall, cpu = time.perf_counter(), children_cpu()
    run_streaming(launch_command(load_config(config, check_paths=False), config, str(dataset)), None, lambda _: None)
    records = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    return {"name": name, "out": out, "wall": time.perf_counter() - wall, "cpu": children_cpu() - cpu,
            "losses": {r["current_steps"]: r["loss"] for r in records if "loss" in r}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--configs", nargs="+", default=["ds_z2_config", "ds_z3_config"])
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from safetensors.torch import load_file

    from tuneline.config import load_config
    from tuneline.data import build_dataset
    from tuneline.demo.tiny_model import TINY_PRESETS, build_tiny_model

    work = args.work or Path(tempfile.mkdtemp(prefix="ds-cpu-"))
    build_tiny_model(work / "model", **TINY_PRESETS["test"])
    values = {**SETTINGS, "model_name_or_path": str(work / "model"), "output_dir": str(work / "unused"),
              "pipeline_cache_dir": str(work / "cache")}
    dataset = work / "dataset.json"
    dataset.write_text(json.dumps(build_dataset(load_config(overrides=values))))
    runs = [train(work, "plain", dataset, args.steps)]
    for name in args.configs:
        for processes in (1, 2):
            runs.append(train(work, f"{name}-{processes}", dataset, args.steps,
                              deepspeed=str(REPO / "examples" / "deepspeed" / f"{name}.json"),
                              num_processes=processes, per_device_train_batch_size=4 // processes))
    plain = runs[0]
    plain_weights = load_file(str(plain["out"] / "model.safetensors"))
    print(f"{'run':<16}{'wall s':>8}{'CPU s':>8}  {'max rel loss diff':>18}{'max abs weight diff':>21}  losses")
    for run in runs:
        weights = load_file(str(run["out"] / "model.safetensors"))
        loss_diff = max(abs(run["losses"][s] - v) / v for s, v in plain["losses"].items())
        weight_diff = max((weights[k] - t).abs().max().item() for k, t in plain_weights.items())
        losses = " ".join(f"{run['losses'][s]:.6f}" for s in sorted(run["losses"]))
        print(f"{run['name']:<16}{run['wall']:>8.1f}{run['cpu']:>8.1f}  {loss_diff:>18.1e}{weight_diff:>21.1e}  "
              f"{losses}")


if __name__ == "__main__":
    main()
