"""The `build-reference-model` step on long DPO pairs: `python benchmarks/reference_precompute.py [--steps 30]
[--batch 4] [--accumulation 1] [--cutoff 2048] [--work DIR]`.

LLaMA-Factory's `dpo_en_demo` pairs (tests/fixtures/llamafactory) at `cutoff_len` 2048 on the demo tiny Llama
(hidden 128, 2 layers, built with its max_position_embeddings raised to the cutoff), LoRA, so the reference is the
policy with its adapter off. Each measurement runs in a fresh process (imports and the model load count, as in
the flow's step), on an empty row cache unless said:

1. `cold`: the step for a run of `--steps` steps of `--batch` x `--accumulation` pairs;
2. `extend`: the same cache, a run of twice the steps (only the rows the first run did not need are computed);
3. `all rows`: the same cache, an epoch-based run (every training row);
4. `all rows, cold`: an epoch-based run on an empty cache, what a first run of the whole dataset costs.

Prints wall seconds of each process, the step's own seconds, rows computed and the torch threads and device used.
Figures only: nothing is asserted. The code before the row cache computed every row on every miss and reported no
`computed_rows`; the script then prints the step's row count.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "fixtures" / "llamafactory" / "0.9.5" / "data"


def run_config(work: Path, cache: str, steps: int, batch: int, accumulation: int, cutoff: int):
    from tuneline.config import load_config

    values = {"model_name_or_path": str(work / "model"), "stage": "dpo", "finetuning_type": "lora", "lora_rank": 8,
              "dataset": "dpo_en_demo", "dataset_dir": str(DATA), "template": "chatml", "cutoff_len": cutoff,
              "val_size": 0, "pref_loss": "sigmoid", "output_dir": str(work / "out"),
              "pipeline_cache_dir": str(work / cache), "per_device_train_batch_size": batch,
              "gradient_accumulation_steps": accumulation, "per_device_eval_batch_size": 8, "seed": 42}
    if steps > 0:
        values["max_steps"] = steps
    return load_config(overrides=values)


def child(work: Path, cache: str, steps: int, batch: int, accumulation: int, cutoff: int) -> dict:
    import torch

    from tuneline.reference import build_reference_logps

    config = run_config(work, cache, steps, batch, accumulation, cutoff)
    data_ref = json.loads((work / "dataset.json").read_text())
    start = time.perf_counter()
    ref = build_reference_logps(config, data_ref)
    seconds = time.perf_counter() - start
    computed = ref.get("computed_rows", sum(ref["rows"].values()))
    return {"seconds": seconds, "computed_rows": computed, "rows": ref["rows"], "device": ref.get("device", "cpu"),
            "threads": ref.get("threads") or torch.get_num_threads(), "train_rows": data_ref["train_rows"]}


def measure(label: str, work: Path, cache: str, steps: int, args) -> dict:
    cmd = [sys.executable, __file__, "--child", "--work", str(work), "--cache", cache, "--steps", str(steps),
           "--batch", str(args.batch), "--accumulation", str(args.accumulation), "--cutoff", str(args.cutoff)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{label} failed:\n{proc.stderr[-3000:]}")
    out = {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall": wall}
    print(f"{label:16} steps {steps if steps > 0 else 'epoch':>5}: {out['wall']:7.1f} s wall, {out['seconds']:7.1f} s "
          f"in the step, {out['computed_rows']:4} rows computed ({out['rows']}), {out['threads']} threads, "
          f"{out['device']}", flush=True)
    return out


def prepare(work: Path, args) -> None:
    """The model and the processed dataset, made once outside the measured processes."""
    from tuneline.data import build_dataset
    from tuneline.demo.tiny_model import TINY_PRESETS, build_tiny_model

    build_tiny_model(work / "model", **TINY_PRESETS["demo"], max_position_embeddings=args.cutoff)
    ref = build_dataset(run_config(work, "cache-data", 0, args.batch, args.accumulation, args.cutoff))
    (work / "dataset.json").write_text(json.dumps(ref))
    print(f"{ref['train_rows']} training pairs, {ref['tokens']} tokens; work dir {work}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--cutoff", type=int, default=2048)
    parser.add_argument("--work", type=Path, default=None, help="keep the model, data and caches here")
    parser.add_argument("--measure", default="cold,extend,all,all-cold",
                        help="which measurements, comma-separated (the code before the row cache: cold)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache", default="cache", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.work, args.cache, args.steps, args.batch, args.accumulation, args.cutoff)))
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="reference-precompute-"))
    if not (work / "dataset.json").is_file():
        prepare(work, args)
    fresh = uuid.uuid4().hex[:8]  # empty caches for this invocation: cold means cold
    plan = {"cold": ("cold", f"cache-{fresh}", args.steps), "extend": ("extend", f"cache-{fresh}", 2 * args.steps),
            "all": ("all rows", f"cache-{fresh}", 0), "all-cold": ("all rows, cold", f"cache-all-{fresh}", 0)}
    for name in args.measure.split(","):
        label, cache, steps = plan[name]
        measure(label, work, cache, steps, args)


if __name__ == "__main__":
    main()
