"""Training throughput on CPU: `python benchmarks/train_throughput.py [--steps 60] [--data alpaca|demo]
[--checkpointing on|off|both]`.

Builds a Llama of hidden 256, 4 layers, vocab 4096 (tuneline.demo.tiny_model) and trains it with sft for a fixed number
of steps (cutoff_len 512, batch 4 x accumulation 2, fp32), LoRA and full, with length grouping and with packing,
each in its own process so peak RSS is that run's. Gradient checkpointing is on by default in tuneline as in
LLaMA-Factory; `--checkpointing both` (the default) runs each configuration with it on and off, one after the
other, so the two are measured under the same load. Prints, per run: non-padding tokens/s (over the trainer's
runtime, and steady state from step 10 on), padding fraction, steps/s, peak RSS, the run's wall time (imports and
model load included) and the model FLOPs utilisation against the matmul FLOP/s measured here first.

Data: `alpaca` (default) is synthetic alpaca-style rows (instruction, optional input, a long-tailed answer) over
the demo corpus' words, the kind of data the LLaMA-Factory reference was measured on (1750 tokens/s LoRA, 1810
full, 2850 packed; LLaMA-Factory checkpoints by default, as tuneline does: compare them with `on` rows of the
same machine); `demo` is the bundled demo_sft set, whose rows are ~25 tokens, so per-step overhead
dominates.
Model FLOPs per trained token: 2 (forward) + 2 (input gradients) + 2 (weight gradients, full tuning only) times
the Linear weights, plus attention 12 x layers x hidden x mean example length (PaLM's MFU count, which ignores
causal masking and does not count checkpointing's second forward: it measures useful work). Figures only: nothing
here is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL_SIZES = {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 4,
               "num_key_value_heads": 4, "vocab_size": 4096, "max_position_embeddings": 1024}
RUNS = {  # name -> config overrides
    "lora": {"finetuning_type": "lora", "lora_rank": 8, "lora_target": "all", "learning_rate": 1e-4,
             "group_by_length": True},
    "full": {"finetuning_type": "full", "learning_rate": 1e-5, "group_by_length": True},
    "lora+packing": {"finetuning_type": "lora", "lora_rank": 8, "lora_target": "all", "learning_rate": 1e-4,
                     "packing": True},
    "full+packing": {"finetuning_type": "full", "learning_rate": 1e-5, "packing": True},
}
STEADY_FROM = 10  # steady-state figures start after this step (warm-up, allocator growth)


def demo_words() -> list[str]:
    """The demo corpus' words without digits (the tiny tokenizer splits numbers digit by digit)."""
    rows = json.loads((REPO / "data" / "demo_sft.json").read_text())
    text = " ".join(f"{r['instruction']} {r['input']} {r['output']}" for r in rows)
    return sorted({w for w in re.findall(r"\S+", text) if not re.search(r"\d", w)})


def alpaca_rows(count: int, seed: int = 0) -> list[dict]:
    """Alpaca-like shape: a 4-20 word instruction, an input on 40% of rows, a long-tailed answer (median 74
    words), about 150 tokens a row with the tiny tokenizer (alpaca averages ~150 Llama tokens)."""
    rng, words = random.Random(seed), demo_words()

    def text(k: int) -> str:
        return " ".join(rng.choice(words) for _ in range(k))

    return [{"instruction": text(rng.randint(4, 20)), "input": text(rng.randint(3, 20)) if rng.random() < 0.4 else "",
             "output": text(min(300, max(3, int(rng.lognormvariate(4.3, 0.8)))))} for _ in range(count)]


def prepare_workspace(work: Path, data: str) -> None:
    from tuneline.demo.tiny_model import build_tiny_model

    if not (work / "model" / "config.json").is_file():
        build_tiny_model(work / "model", **MODEL_SIZES)
    data_dir = work / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    if data == "alpaca":
        (data_dir / "bench.json").write_text(json.dumps(alpaca_rows(2400)))
        (data_dir / "dataset_info.json").write_text(json.dumps({"bench": {"file_name": "bench.json"}}))
    else:
        info = json.loads((REPO / "data" / "dataset_info.json").read_text())
        (data_dir / "demo_sft.json").write_text((REPO / "data" / "demo_sft.json").read_text())
        (data_dir / "dataset_info.json").write_text(json.dumps({"bench": info["demo_sft"] | {
            "file_name": "demo_sft.json"}}))


def run_config(work: Path, name: str, steps: int, checkpointing: str = "on"):
    from tuneline.config import load_config

    values = {"model_name_or_path": str(work / "model"), "stage": "sft", "dataset": "bench",
              "dataset_dir": str(work / "data"), "template": "chatml", "cutoff_len": 512,
              "output_dir": str(work / "out" / name.replace("+", "_")), "overwrite_output_dir": True,
              "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "max_steps": steps,
              "lr_scheduler_type": "cosine", "warmup_steps": 0.1, "logging_steps": 10, "save_strategy": "no",
              "seed": 42, "dataloader_num_workers": 0, "pipeline_cache_dir": str(work / "cache"),
              "preprocessing_num_workers": 1, "disable_gradient_checkpointing": checkpointing == "off", **RUNS[name]}
    return load_config(None, values, check_paths=False)


class CountingCollator:
    """Wraps the stage's collator: real (non-padding) and padded token counts of every batch it builds."""

    def __init__(self, inner):
        self.inner, self.real, self.padded = inner, 0, 0

    def __call__(self, features):
        batch = self.inner(features)
        self.real += sum(len(f["input_ids"]) for f in features)
        self.padded += batch["input_ids"].numel()
        return batch


def step_timer(collator: CountingCollator):
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.marks: dict[int, tuple[float, int]] = {}

        def on_step_end(self, args, state, control, **kwargs):
            self.marks[state.global_step] = (time.perf_counter(), collator.real)

    return StepTimer()


def matmul_flops_per_param(model) -> int:
    """Weights every token goes through in a matmul: all Linear layers (lm_head included, embeddings not)."""
    import torch

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def train_once(work: Path, name: str, steps: int, checkpointing: str) -> dict:
    """One run in this process (the parent starts one process per run)."""
    from tuneline.data import build_collator, build_dataset, load_processed
    from tuneline.model.loader import load_model
    from tuneline.model.tokenizer import load_tokenizer
    from tuneline.train.sft import SPEC
    from tuneline.train.trainer_base import build_trainer

    config = run_config(work, name, steps, checkpointing)
    started = time.perf_counter()
    datasets = load_processed(build_dataset(config))
    data_s = time.perf_counter() - started
    tokenizer = load_tokenizer(config.model)
    model = load_model(config, tokenizer, is_trainable=True)
    collator = CountingCollator(build_collator("sft", tokenizer, config.data.pad_to_multiple_of))
    timer = step_timer(collator)
    trainer = build_trainer(config, SPEC, model, tokenizer, datasets, collator, [timer])
    peak_before = measure_matmul_flops(1.5)
    metrics = trainer.train().metrics
    peak = (peak_before + measure_matmul_flops(1.5)) / 2  # the machine is shared: measured around the run
    (t0, tok0), (t1, tok1) = timer.marks[STEADY_FROM], timer.marks[steps]
    weights = matmul_flops_per_param(trainer.model)
    lengths = [len(ids) for ids in datasets["train"]["input_ids"]]
    examples = (sum(row.count(0) for row in datasets["train"]["position_ids"])
                if "position_ids" in datasets["train"].column_names else len(lengths))
    return {"run": name, "checkpointing": checkpointing, "runtime_s": metrics["train_runtime"], "data_s": data_s,
            "real_tokens": collator.real,
            "padded_tokens": collator.padded, "steady_tokens_per_s": (tok1 - tok0) / (t1 - t0),
            "steady_steps_per_s": (steps - STEADY_FROM) / (t1 - t0), "steps": steps,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "linear_weights": weights,
            "full": config.finetuning.finetuning_type == "full", "mean_row_tokens": sum(lengths) / len(lengths),
            "mean_example_tokens": sum(lengths) / examples,
            "packed": bool(config.data.packing), "train_rows": len(lengths), "train_loss": metrics.get("train_loss"),
            "matmul_flops": peak, "load_average": os.getloadavg()[0]}


def measure_matmul_flops(seconds: float = 3.0) -> float:
    """Best fp32 matmul FLOP/s of a few shapes (square, and the lm_head's), all threads torch uses."""
    import torch

    best = 0.0
    for m, k, n in ((1024, 1024, 1024), (2048, 256, 4096), (2048, 256, 688)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        for _ in range(3):
            a @ b
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 3:
            a @ b
            count += 1
        best = max(best, 2 * m * k * n * count / (time.perf_counter() - start))
    return best


def model_flops(run: dict) -> float:
    """Model FLOPs of the run's real tokens (see the module docstring)."""
    per_token = (6 if run["full"] else 4) * run["linear_weights"]
    attention = 12 * MODEL_SIZES["num_hidden_layers"] * MODEL_SIZES["hidden_size"] * run["mean_example_tokens"]
    return run["real_tokens"] * (per_token + attention)


def report(runs: list[dict]) -> None:
    header = (f"{'run':<14}{'ckpt':>5}{'steps':>6}{'tok/s':>8}{'steady':>8}{'pad %':>7}{'steps/s':>9}{'RSS MB':>8}"
              f"{'wall s':>8}"
              f"{'GFLOP/s':>8}{'MFU %':>7}{'load':>6}{'tok/row':>8}")
    print(header)
    for r in runs:
        tok_s = r["real_tokens"] / r["runtime_s"]
        mfu = model_flops(r) / r["runtime_s"] / r["matmul_flops"]
        pad = 100 * (1 - r["real_tokens"] / r["padded_tokens"])
        print(f"{r['run']:<14}{r['checkpointing']:>5}{r['steps']:>6}{tok_s:>8.0f}{r['steady_tokens_per_s']:>8.0f}"
              f"{pad:>7.1f}"
              f"{r['steps'] / r['runtime_s']:>9.3f}{r['peak_rss_mb']:>8.0f}{r['wall_s']:>8.1f}"
              f"{r['matmul_flops'] / 1e9:>8.1f}{100 * mfu:>7.1f}{r['load_average']:>6.1f}{r['mean_row_tokens']:>8.1f}")
    print(f"tok/s: non-padding tokens / trainer runtime; steady: from step {STEADY_FROM}; ckpt: gradient "
          "checkpointing; wall: the whole process (imports, data, model load); GFLOP/s: fp32 matmul peak measured "
          "around the run (the machine is shared); "
          "load: 1-minute load average at the end")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--packed-steps", type=int, default=None, help="steps of the packed runs (default: --steps;"
                        " a packed step trains ~3x the tokens)")
    parser.add_argument("--data", choices=("alpaca", "demo"), default="alpaca")
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {', '.join(RUNS)}")
    parser.add_argument("--checkpointing", choices=("on", "off", "both"), default="both",
                        help="gradient checkpointing (tuneline's default: on); both: each run with it on, then off")
    parser.add_argument("--work", default=None, help="workspace folder (default: a temporary one)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child mode: one run, JSON on stdout
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(train_once(Path(args.work), args.one, args.steps, args.checkpointing)),
              flush=True)
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="tuneline-train-bench-"))
    prepare_workspace(work, args.data)
    runs = []
    settings = ("on", "off") if args.checkpointing == "both" else (args.checkpointing,)
    for name in args.runs.split(","):
        for checkpointing in settings:
            start = time.perf_counter()
            steps = args.packed_steps if "packing" in name and args.packed_steps else args.steps
            proc = subprocess.run([sys.executable, __file__, "--one", name, "--work", str(work), "--steps",
                                   str(steps), "--checkpointing", checkpointing], capture_output=True, text=True)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if proc.returncode or not lines:
                sys.exit(f"run {name} (checkpointing {checkpointing}) failed:\n{proc.stderr[-3000:]}")
            runs.append({**json.loads(lines[-1][7:]), "wall_s": time.perf_counter() - start})
            print(f"{name}, checkpointing {checkpointing}: done in {runs[-1]['wall_s']:.1f} s", flush=True)
    report(runs)
    print(f"workspace: {work}")


if __name__ == "__main__":
    main()
