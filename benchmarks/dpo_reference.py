"""Live vs precomputed DPO reference: `python benchmarks/dpo_reference.py [--steps 20] [--hidden 512] [--layers 4]
[--vocab 512]`.

Full-tuning DPO (the reference is then a frozen copy of the starting model) on a tiny Llama large enough that
compute, not Python overhead, dominates a step. A live reference costs one more copy of the weights beside the
policy's four (weights, gradients, two AdamW moments); its forward runs before the policy's, so its activations are
freed before the policy's are kept for backward. Precomputing can therefore save at most a fifth of the model's
memory, and a quarter of a step's compute (one forward of four forward-equivalents). Every training run is a fresh
subprocess, so its peak RSS is its own: four runs of a `pref_beta` sweep with the reference run live on every
batch, one `build-reference-model` precompute, and the same four runs on the stored log-probs. Prints peak RSS (and
the part above the process's RSS after imports), seconds per step (median and fastest, first two steps dropped),
the precompute time and both sweeps' wall time, with the ratios the preference-stages issue sets targets for.
Figures only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BETAS = (0.05, 0.1, 0.2, 0.5)


def run_config(work: Path, beta: float, mode: str, steps: int):
    from tuneline.config import load_config

    values = {"model_name_or_path": str(work / "model"), "stage": "dpo", "finetuning_type": "full",
              "dataset": "demo_pref", "dataset_dir": str(REPO / "data"), "cutoff_len": 128, "max_samples": 512,
              "val_size": 0, "pref_loss": "sigmoid", "pref_beta": beta, "precompute_ref": mode != "live",
              "output_dir": str(work / f"out-{mode}-{beta}"), "overwrite_output_dir": True,
              "pipeline_cache_dir": str(work / "cache"), "per_device_train_batch_size": 8,
              "per_device_eval_batch_size": 16, "learning_rate": 1e-5, "max_steps": steps, "save_strategy": "no",
              "eval_strategy": "no", "logging_steps": 1000, "seed": 0, "disable_tqdm": True,
              "dataloader_num_workers": 0}
    return load_config(overrides=values)


def step_timer():
    """A TrainerCallback recording the wall time of every optimizer step."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self._start = [], None

        def on_step_begin(self, args, state, control, **kwargs):
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self._start)

    return StepTimer()


def rss_mb() -> float:
    """Current resident set size in MiB (Linux)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(mode: str, work: Path, beta: float, steps: int) -> dict:
    """One measured process: `train` with a live or stored reference, or the one-off `precompute`."""
    import torch  # noqa: F401  (imports count towards the baseline, not the training's share)
    import transformers  # noqa: F401

    from tuneline.data import build_dataset
    from tuneline.reference import build_reference_logps
    from tuneline.train.dpo import run

    config = run_config(work, beta, "live" if mode == "live" else "precomputed", steps)
    data_ref = build_dataset(config)
    baseline = rss_mb()
    start = time.perf_counter()
    if mode == "precompute":
        config.pipeline.refresh_cache = True
        ref = build_reference_logps(config, data_ref)
        return {"seconds": time.perf_counter() - start, "baseline_mb": baseline, "rows": ref["rows"]}
    ref = build_reference_logps(config, data_ref) if mode == "precomputed" else data_ref
    if mode == "precomputed":
        if not ref["cache_hit"]:
            raise RuntimeError("the parent precomputes before the stored-reference runs")
    timer = step_timer()
    run(config, ref, [timer])
    return {"s_per_step": statistics.median(timer.times[2:]), "min_s_per_step": min(timer.times[2:]), "steps": len(timer.times), "baseline_mb": baseline,
            "train_seconds": time.perf_counter() - start}


def measure(mode: str, work: Path, beta: float, steps: int) -> dict:
    """Run `child` in a fresh interpreter; add its wall time and peak RSS."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, __file__, "--child", mode, "--work", str(work), "--beta", str(beta),
           "--steps", str(steps)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{mode} run failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    peak = out.pop("peak_mb")
    return {**out, "wall": wall, "peak_mb": peak, "above_baseline_mb": peak - out["baseline_mb"]}


def prepare(work: Path, hidden: int, layers: int, vocab: int) -> None:
    """The benchmark model and its processed dataset (built once, outside the measured processes)."""
    from tuneline.data import build_dataset
    from tuneline.demo.tiny_model import build_tiny_model

    build_tiny_model(work / "model", hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                     num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8)
    if vocab > 512:  # the same tokenizer and data, the logits as wide as a real tokenizer's (unused rows padded)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(work / "model")
        model.resize_token_embeddings(vocab, mean_resizing=False)
        model.save_pretrained(work / "model")
    build_dataset(run_config(work, BETAS[0], "live", 1))


def report(live: list[dict], precompute: dict, stored: list[dict]) -> None:
    def med(rows, key):
        return statistics.median(r[key] for r in rows)

    lines = [("peak RSS (MiB)", med(live, "peak_mb"), med(stored, "peak_mb")),
             ("peak RSS above imports (MiB)", med(live, "above_baseline_mb"), med(stored, "above_baseline_mb")),
             ("seconds per step (median)", med(live, "s_per_step"), med(stored, "s_per_step")),
             ("seconds per step (fastest)", min(r["min_s_per_step"] for r in live),
              min(r["min_s_per_step"] for r in stored)),
             (f"{len(BETAS)}-point pref_beta sweep, wall s", sum(r["wall"] for r in live),
              precompute["wall"] + sum(r["wall"] for r in stored))]
    print(f"\n{'':34} {'live':>10} {'precomputed':>12} {'ratio':>7}")
    for name, a, b in lines:
        print(f"{name:34} {a:10.3f} {b:12.3f} {b / a:7.2f}")
    print(f"one-off precompute: {precompute['seconds']:.2f} s inside the step, {precompute['wall']:.2f} s as a "
          f"process (rows {precompute['rows']})")
    print("(the precomputed sweep's wall time includes the precompute process)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512, help="the model's vocabulary: above the tokenizer's 512, "
                        "padded with rows no token uses (e.g. 32000, a real tokenizer's width of logits)")
    parser.add_argument("--work", type=Path, default=None, help="keep model, data and outputs here")
    parser.add_argument("--child", choices=("live", "precomputed", "precompute"), help=argparse.SUPPRESS)
    parser.add_argument("--beta", type=float, default=BETAS[0], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        out = child(args.child, args.work, args.beta, args.steps)
        out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(out))
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="dpo-reference-"))
    prepare(work, args.hidden, args.layers, args.vocab)
    print(f"model: hidden {args.hidden}, {args.layers} layers, vocabulary {args.vocab}; {args.steps} steps of batch "
          f"8; work dir {work}")
    precompute = measure("precompute", work, BETAS[0], args.steps)
    live, stored = [], []
    for beta in BETAS:  # interleaved, so load from other processes on the machine hits both sides alike
        live.append(measure("live", work, beta, args.steps))
        stored.append(measure("precomputed", work, beta, args.steps))
    for beta, a, b in zip(BETAS, live, stored, strict=True):
        print(f"pref_beta {beta}: live {a['s_per_step']:.3f} s/step {a['peak_mb']:.0f} MiB {a['wall']:.1f} s | "
              f"precomputed {b['s_per_step']:.3f} s/step {b['peak_mb']:.0f} MiB {b['wall']:.1f} s")
    report(live, precompute, stored)


if __name__ == "__main__":
    main()
