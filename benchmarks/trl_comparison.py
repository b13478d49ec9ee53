"""tuneline's dpo, kto and rm trainers against trl's: `python benchmarks/trl_comparison.py [--steps 40] [--pairs 3]
[--stages dpo,kto,rm] [--vocab 512] [--checkpointing on|off]`.

The same training run twice per stage, each in a fresh process: tuneline's own path (`preference_stage` / `run_stage`,
what `python -m tuneline.train CONFIG` calls) and trl's DPOTrainer, KTOTrainer or RewardTrainer given the same
tokenized rows, the same cached reference log-probs as columns, the same LoRA adapter (tuneline's `lora_config`, the
same seed), the same TrainingArguments (built from the same config), the same gradient checkpointing (tuneline's, on
by default as in LLaMA-Factory) and the same callbacks. Tiny demo Llama, the demo preference data, LoRA rank 16 on
every linear layer, sigmoid DPO / KTO at beta 0.1, batch 8, cutoff 128, seed 42.

Every training step's loss is kept exactly (not the 4-digit log), so the two sides' per-step losses can be compared:
the same maths gives the same losses within float noise. Time per step is measured from one step's end to the next
(data loading, forward, backward, optimizer and logging: the whole loop), the first two steps dropped, as wall time and
as the process's CPU time (one thread, so it moves less than wall time when other processes share the cores); runs
alternate in pairs (tuneline, trl, then trl, tuneline, ...) so load from other processes hits both alike, and the
table gives the median over pairs with the fastest and slowest run, and the median of the per-pair ratios. Memory is
the training's own: the RSS high-water mark is reset when training starts (model and data loaded) and read when the run
ends, less the RSS at the start; on CUDA the GPU's peak allocation above its start. The process's whole peak RSS
(ru_maxrss, reached while loading) is given beside it.

A probe run first records what trl does with our data: whether its own tokenization of the raw rows (through the
tokenizer's chat template) gives our token ids, whether DPOTrainer accepts already tokenized rows, and whether it
takes our reference columns with `precompute_ref_log_probs=True`. trl's DPO/KTO trainers have no input path for
tokenized rows, so the measured trl runs pass them through a subclass whose `_prepare_dataset` returns the rows as they
are, and read our reference columns by setting `precompute_ref_logps` after construction (with the option on, the
constructor would compute its own). Figures only: nothing is asserted.
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
SIDES = ("tuneline", "trl")
# stage -> (dataset, learning rate as in examples/<stage>_lora_demo.yaml)
STAGES = {"dpo": ("demo_pref", 2e-3), "kto": ("demo_kto", 2e-3), "rm": ("demo_pref", 1e-3)}
DROPPED_STEPS = 2
LOSSES: list[float] = []  # every training step's loss in this process, in order


def run_config(work: Path, stage: str, side: str, steps: int, checkpointing: bool = True):
    from tuneline.config import load_config

    dataset, lr = STAGES[stage]
    values = {"model_name_or_path": str(work / "model"), "stage": stage, "finetuning_type": "lora",
              "lora_rank": 16, "lora_target": "all", "dataset": dataset, "dataset_dir": str(REPO / "data"),
              "template": "chatml", "cutoff_len": 128, "max_samples": 512, "val_size": 0,
              "output_dir": str(work / f"out-{side}-{stage}"), "overwrite_output_dir": True,
              "pipeline_cache_dir": str(work / "cache"), "per_device_train_batch_size": 8,
              "per_device_eval_batch_size": 32, "learning_rate": lr, "max_steps": steps,
              "lr_scheduler_type": "cosine", "warmup_ratio": 0.05, "seed": 42, "save_strategy": "no",
              "eval_strategy": "no", "logging_steps": 10, "disable_tqdm": True, "dataloader_num_workers": 0,
              "disable_gradient_checkpointing": not checkpointing}
    if stage in ("dpo", "kto"):
        values.update(pref_beta=0.1, precompute_ref=True)
    if stage == "kto":  # trl's KTOTrainer refuses any other order (its KL completions are a batch's neighbours)
        values["disable_shuffling"] = True
    if stage == "dpo":
        values["pref_loss"] = "sigmoid"
    return load_config(overrides=values)


def processed_reference(config) -> dict:
    """The processed dataset, with the cached reference log-prob columns for dpo and kto (built by `prepare`)."""
    from tuneline.data import build_dataset
    from tuneline.reference import build_reference_logps

    data_ref = build_dataset(config)
    return build_reference_logps(config, data_ref) if config.stage in ("dpo", "kto") else data_ref


def rss_mb() -> float:
    """Current resident set size in MiB (Linux)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_high_water_mb() -> float:
    """Peak resident set size since the process started or since `reset_rss_high_water` (Linux)."""
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024


def reset_rss_high_water() -> None:
    Path("/proc/self/clear_refs").write_text("5")


# --- what both sides share: loss recording and the step timer
def recording(trainer_class, tokenized_rows: bool = False):
    """`trainer_class` that keeps each training step's loss in LOSSES; with `tokenized_rows`, trl's
    `_prepare_dataset` (tokenization from text) returns our already tokenized rows unchanged."""

    class Recording(trainer_class):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                       num_items_in_batch=num_items_in_batch)
            if model.training:
                LOSSES.append(float((out[0] if return_outputs else out).detach()))
            return out

        if tokenized_rows:
            def _prepare_dataset(self, dataset, *args, **kwargs):
                return dataset

    return Recording


def step_timer():
    """A TrainerCallback: wall and CPU time from one step's end to the next, and the trainable weights' checksum."""
    import torch
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.wall, self.cpu, self.last, self.trainable = [], [], None, None
            self.start_mb = self.start_gpu_mb = 0.0

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            params = [p for p in model.parameters() if p.requires_grad]
            self.trainable = {"count": sum(p.numel() for p in params),
                              "checksum": float(sum(p.detach().double().sum() for p in params))}
            reset_rss_high_water()  # from here the peak is the training's: model and data are loaded
            self.start_mb = rss_mb()
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
                self.start_gpu_mb = torch.cuda.memory_allocated() / 2**20
            self.last = (time.perf_counter(), time.process_time())

        def on_step_end(self, args, state, control, **kwargs):
            now = (time.perf_counter(), time.process_time())
            self.wall.append(now[0] - self.last[0])
            self.cpu.append(now[1] - self.last[1])
            self.last = now

    return StepTimer()


# --- side (a): tuneline's own trainers, as the training process runs them
def train_tuneline(config, data_ref: dict, timer) -> None:
    from dataclasses import replace

    if config.stage == "rm":
        from tuneline.train import rm
        from tuneline.train.trainer_base import run_stage

        run_stage(config, data_ref, [timer], replace(rm.SPEC, trainer_class=recording(rm.SPEC.trainer_class)))
        return
    from tuneline.train.dpo import DPOTrainer, preference_stage
    from tuneline.train.kto import KTOTrainer

    trainer_class = {"dpo": DPOTrainer, "kto": KTOTrainer}[config.stage]
    preference_stage(config.stage, recording(trainer_class))(config, data_ref, [timer])


# --- side (b): trl's trainers on the same rows, model, arguments and callbacks
def prompt_length(labels: list[int]) -> int:
    """Tokens before the first labelled one: the prompt of a tuneline preference row."""
    return next((i for i, label in enumerate(labels) if label != -100), len(labels))


def dpo_rows(row: dict) -> dict:
    """A tuneline dpo row (with reference columns) as trl's DPOTrainer takes it after its tokenization."""
    p = prompt_length(row["chosen_labels"])
    if row["rejected_input_ids"][:p] != row["chosen_input_ids"][:p]:
        raise ValueError("chosen and rejected rows do not share their prompt")
    return {"prompt_ids": row["chosen_input_ids"][:p], "chosen_ids": row["chosen_input_ids"][p:],
            "rejected_ids": row["rejected_input_ids"][p:], "ref_chosen_logps": row["ref_chosen_logps"],
            "ref_rejected_logps": row["ref_rejected_logps"]}


def kto_rows(row: dict) -> dict:
    """A tuneline kto row as trl's KTOTrainer takes it: our mismatched (`kl_*`) completion after the same prompt."""
    p, kl_p = prompt_length(row["labels"]), prompt_length(row["kl_labels"])
    if row["kl_input_ids"][:kl_p] != row["input_ids"][:p]:
        raise ValueError("a KL row's prompt differs from its row's (truncated differently)")
    return {"prompt_ids": row["input_ids"][:p], "completion_ids": row["input_ids"][p:],
            "KL_completion_ids": row["kl_input_ids"][kl_p:], "label": bool(row["kto_tags"]),
            "ref_logps": row["ref_logps"], "ref_KL_logps": row["ref_kl_logps"]}


def rm_rows(row: dict) -> dict:
    return {"chosen_ids": row["chosen_input_ids"], "rejected_ids": row["rejected_input_ids"]}


def trl_trainer(config, data_ref: dict, callbacks: list):
    """trl's trainer for the stage, built from the same config as tuneline's."""
    import trl

    from tuneline.data import load_processed
    from tuneline.model.adapters import lora_config
    from tuneline.model.loader import enable_checkpointing, load_base_model
    from tuneline.model.tokenizer import load_tokenizer
    from tuneline.train.training_args import device_defaults, translate_training_keys

    stage, ft = config.stage, config.finetuning
    tokenizer = load_tokenizer(config.model)
    model = load_base_model(config, tokenizer, is_trainable=True, add_valuehead=stage == "rm")
    if not config.model.disable_gradient_checkpointing:  # as tuneline.model enables it, not with trl's own kwargs
        enable_checkpointing(model, config)
    peft_config = lora_config(model, config, add_valuehead=stage == "rm")
    train = load_processed(data_ref)["train"]
    train = train.map({"dpo": dpo_rows, "kto": kto_rows, "rm": rm_rows}[stage], remove_columns=train.column_names)
    kwargs = device_defaults(translate_training_keys(config.training), config)
    kwargs.update(gradient_checkpointing=False, max_length=None,  # trl's defaults differ: True, 1024, "auto"
                  pad_to_multiple_of=config.data.pad_to_multiple_of)
    if stage == "dpo":
        args = trl.DPOConfig(**kwargs, beta=ft.pref_beta, loss_type=[ft.pref_loss])
    elif stage == "kto":
        args = trl.KTOConfig(**kwargs, beta=ft.pref_beta, desirable_weight=ft.kto_chosen_weight,
                             undesirable_weight=ft.kto_rejected_weight)
    else:
        args = trl.RewardConfig(**kwargs)
    trainer_class = {"dpo": trl.DPOTrainer, "kto": trl.KTOTrainer, "rm": trl.RewardTrainer}[stage]
    trainer = recording(trainer_class, tokenized_rows=stage != "rm")(
        model=model, args=args, train_dataset=train, processing_class=tokenizer, peft_config=peft_config,
        callbacks=callbacks)
    if stage != "rm":
        trainer.precompute_ref_logps = True  # read our ref_* columns; the constructor ran with the option off
    return trainer, tokenizer


def train_trl(config, data_ref: dict, timer) -> None:
    from transformers import set_seed

    from tuneline.train.callbacks import build_callbacks
    from tuneline.train.trainer_base import StageSpec, train_and_evaluate

    set_seed(int(config.training["seed"]))
    trainer, tokenizer = trl_trainer(config, data_ref, build_callbacks(config, config.output_dir, [timer]))
    train_and_evaluate(trainer, config, StageSpec(name=config.stage), tokenizer)


def child(side: str, stage: str, work: Path, steps: int, checkpointing: bool) -> dict:
    """One measured training process."""
    # each side's trainers imported first (trl's import is lazy), before anything is timed
    import torch

    import tuneline.train.callbacks  # noqa: F401
    import tuneline.train.trainer_base  # noqa: F401

    if side == "trl":
        from trl import DPOTrainer, KTOTrainer, RewardTrainer  # noqa: F401
    else:
        import tuneline.train.dpo  # noqa: F401
        import tuneline.train.kto  # noqa: F401
        import tuneline.train.rm  # noqa: F401
    config = run_config(work, stage, side, steps, checkpointing)
    data_ref = processed_reference(config)
    if not data_ref["cache_hit"]:
        raise RuntimeError("the parent builds the datasets and reference log-probs before the measured runs")
    timer, start = step_timer(), time.perf_counter()
    (train_trl if side == "trl" else train_tuneline)(config, data_ref, timer)
    wall, cpu = timer.wall[DROPPED_STEPS:], timer.cpu[DROPPED_STEPS:]
    gpu = {}
    if torch.cuda.is_available():
        gpu["gpu_train_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20 - timer.start_gpu_mb
    return {"losses": LOSSES, "s_per_step": statistics.median(wall), "cpu_s_per_step": statistics.median(cpu),
            "steps": len(timer.wall), "train_peak_mb": rss_high_water_mb() - timer.start_mb, **gpu,
            "trainable": timer.trainable, "train_seconds": time.perf_counter() - start}


# --- the probe: what trl makes of our data without help
def conversational(row: dict, stage: str) -> dict:
    """A raw alpaca row as trl's conversational format, the prompt joined as tuneline's converter joins it."""
    user = "\n".join(t for t in (row["instruction"], row["input"]) if t)
    out = {"prompt": [{"role": "user", "content": user}]}
    if stage == "kto":
        return {**out, "completion": [{"role": "assistant", "content": row["output"]}], "label": row["kto_tag"]}
    return {**out, **{k: [{"role": "assistant", "content": row[k]}] for k in ("chosen", "rejected")}}


def probe_trainer(stage: str, work: Path, rows, precompute: bool = False):
    """trl's trainer built on `rows` (nothing trained), or the error its constructor raises."""
    import trl

    from tuneline.model.adapters import lora_config
    from tuneline.model.loader import load_base_model
    from tuneline.model.tokenizer import load_tokenizer

    config = run_config(work, stage, "probe", 1)
    tokenizer = load_tokenizer(config.model)
    model = load_base_model(config, tokenizer, is_trainable=True, add_valuehead=stage == "rm")
    kwargs = {"output_dir": str(work / "out-probe"), "bf16": False, "gradient_checkpointing": False,
              "max_length": None, "report_to": "none", "max_steps": 1, "per_device_train_batch_size": 8}
    if stage != "rm":
        kwargs["precompute_ref_log_probs"] = precompute
    configs = {"dpo": trl.DPOConfig, "kto": trl.KTOConfig, "rm": trl.RewardConfig}
    trainers = {"dpo": trl.DPOTrainer, "kto": trl.KTOTrainer, "rm": trl.RewardTrainer}
    try:
        return trainers[stage](model=model, args=configs[stage](**kwargs), train_dataset=rows,
                               processing_class=tokenizer,
                               peft_config=lora_config(model, config, add_valuehead=stage == "rm"))
    except (KeyError, ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {str(exc)[:120]}"


def same_tokens(stage: str, ours, theirs) -> int:
    """How many of our processed rows trl's tokenization of the raw data reproduces (ids and prompt boundary)."""
    if stage == "rm":
        keys = {(tuple(r["chosen_ids"]), tuple(r["rejected_ids"])) for r in theirs}
        return sum((tuple(r["chosen_input_ids"]), tuple(r["rejected_input_ids"])) in keys for r in ours)
    if stage == "kto":
        keys = {(tuple(r["prompt_ids"] + r["completion_ids"]), len(r["prompt_ids"])) for r in theirs}
        return sum((tuple(r["input_ids"]), prompt_length(r["labels"])) in keys for r in ours)
    keys = {(tuple(r["prompt_ids"] + r["chosen_ids"]), tuple(r["prompt_ids"] + r["rejected_ids"]),
             len(r["prompt_ids"])) for r in theirs}
    return sum((tuple(r["chosen_input_ids"]), tuple(r["rejected_input_ids"]), prompt_length(r["chosen_labels"]))
               in keys for r in ours)


def probe(work: Path, stages: list[str]) -> dict[str, str]:
    """What trl's constructors make of our data: its own tokenization, our tokenized rows, our reference columns."""
    from datasets import Dataset

    from tuneline.data import load_processed

    out = {}
    for stage in stages:
        ours = load_processed(processed_reference(run_config(work, stage, "probe", 1)))["train"]
        raw = json.loads((REPO / "data" / f"{STAGES[stage][0]}.json").read_text())
        text = Dataset.from_list([conversational(row, stage) for row in raw])
        trainer = probe_trainer(stage, work, text)
        out[f"{stage}: trl's own tokenization of the raw rows gives our ids"] = (
            trainer if isinstance(trainer, str) else f"{same_tokens(stage, ours, trainer.train_dataset)}/{len(ours)}")
        if stage == "dpo":
            tokenized = ours.select(range(16)).map(dpo_rows, remove_columns=ours.column_names)
            out["dpo: DPOTrainer on our tokenized rows"] = probe_trainer(stage, work, tokenized.select_columns(
                ["prompt_ids", "chosen_ids", "rejected_ids"]))
            with_ref = text.select(range(16)).add_column("ref_chosen_logps", [0.0] * 16)
            with_ref = with_ref.add_column("ref_rejected_logps", [0.0] * 16)
            out["dpo: precompute_ref_log_probs with our ref columns present"] = probe_trainer(
                stage, work, with_ref, precompute=True)
    return {k: v if isinstance(v, str) else "accepted" for k, v in out.items()}


# --- the parent
def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), TOKENIZERS_PARALLELISM="false",
               HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_OFFLINE="1")  # trl's trainers report each construction
    return env


def in_child(*args: str) -> dict:
    """Run this file with `args` in a fresh interpreter; its last stdout line is JSON. Adds wall time."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, *args], cwd=REPO, env=child_env(), capture_output=True,
                          text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall"] = time.perf_counter() - start
    return out


def prepare(work: Path, stages: list[str], steps: int, vocab: int) -> None:
    """The demo tiny model, the processed datasets and the reference log-probs, built once before any run."""
    from tuneline.demo.tiny_model import TINY_PRESETS, build_tiny_model

    build_tiny_model(work / "model", **TINY_PRESETS["demo"])
    if vocab > 512:  # the same tokenizer and data, the logits as wide as a real tokenizer's (unused rows padded)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(work / "model")
        model.resize_token_embeddings(vocab, mean_resizing=False)
        model.save_pretrained(work / "model")
    for stage in stages:
        processed_reference(run_config(work, stage, "prepare", steps))


def loss_gap(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        return float("nan")
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def spread(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def report(stage: str, runs: dict[str, list[dict]]) -> list[str]:
    """Table rows for one stage: each trainer's figures, then how trl's compare with tuneline's."""
    ours, theirs = runs["tuneline"], runs["trl"]
    memory = "gpu_train_peak_mb" if "gpu_train_peak_mb" in ours[0] else "train_peak_mb"
    lines = []
    for side, rows in runs.items():
        wall = spread([r["s_per_step"] * 1000 for r in rows], ".1f")
        cpu = spread([r["cpu_s_per_step"] * 1000 for r in rows], ".1f")
        train_peak = spread([r[memory] for r in rows], ".0f")
        peak = spread([r["peak_mb"] for r in rows], ".0f")
        lines.append(f"| {stage} | {side} | {rows[0]['losses'][-1]:.6f} | {wall} | {cpu} | {train_peak} | {peak} |")
    gap = max(loss_gap(a["losses"], b["losses"]) for a, b in zip(ours, theirs, strict=True))
    noise = max([loss_gap(ours[0]["losses"], r["losses"]) for r in ours[1:]] or [0.0])
    same_start = all(r["trainable"] == ours[0]["trainable"] for r in ours + theirs)
    pairs = list(zip(ours, theirs, strict=True))
    wall = spread([b["s_per_step"] / a["s_per_step"] for a, b in pairs], ".2f")
    cpu = spread([b["cpu_s_per_step"] / a["cpu_s_per_step"] for a, b in pairs], ".2f")
    train_peak = statistics.median(b[memory] - a[memory] for a, b in pairs)
    peak = statistics.median(b["peak_mb"] - a["peak_mb"] for a, b in pairs)
    lines.append(f"| {stage} | trl / tuneline | per-step losses differ by at most {gap:.1e} over "
                 f"{len(ours[0]['losses'])} steps (tuneline rerun: {noise:.1e}); same trainable weights at start: "
                 f"{'yes' if same_start else 'NO'} | {wall} | {cpu} | {train_peak:+.0f} | {peak:+.0f} |")
    return lines


def measure(stage: str, work: Path, steps: int, pairs: int, checkpointing: str) -> dict[str, list[dict]]:
    """`pairs` runs of each side, alternating, so load from other processes hits both sides alike."""
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for pair in range(pairs):
        for side in SIDES if pair % 2 == 0 else SIDES[::-1]:  # ABBA: neither side always goes first
            run = in_child("--child", side, "--stage", stage, "--work", str(work), "--steps", str(steps),
                           "--checkpointing", checkpointing)
            runs[side].append(run)
            gpu = f", GPU +{run['gpu_train_peak_mb']:.0f} MiB" if "gpu_train_peak_mb" in run else ""
            print(f"{stage} {side:8}: {run['s_per_step'] * 1000:6.1f} ms/step, CPU {run['cpu_s_per_step'] * 1000:.1f} "
                  f"ms/step, training +{run['train_peak_mb']:.0f} MiB RSS{gpu} (process peak {run['peak_mb']:.0f}), "
                  f"final loss {run['losses'][-1]:.6f}, wall {run['wall']:.1f} s", flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--stages", default="dpo,kto,rm")
    parser.add_argument("--checkpointing", choices=("on", "off"), default="on",
                        help="gradient checkpointing on both sides (on: tuneline's and LLaMA-Factory's default)")
    parser.add_argument("--vocab", type=int, default=512, help="the model's vocabulary: above the tokenizer's 512, "
                        "padded with rows no token uses (e.g. 32000, a real tokenizer's width of logits)")
    parser.add_argument("--work", type=Path, default=None, help="keep model, data and outputs here")
    parser.add_argument("--child", choices=(*SIDES, "probe"), help=argparse.SUPPRESS)
    parser.add_argument("--stage", choices=tuple(STAGES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    stages = [s for s in args.stages.split(",") if s]
    if args.child == "probe":
        print(json.dumps(probe(args.work, stages)))
        return
    if args.child:
        out = child(args.child, args.stage, args.work, args.steps, args.checkpointing == "on")
        out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(out))
        return
    import trl

    work = args.work or Path(tempfile.mkdtemp(prefix="trl-comparison-"))
    prepare(work, stages, args.steps, args.vocab)
    print(f"trl {trl.__version__}; tiny demo Llama (vocabulary {args.vocab}), LoRA r16; {args.steps} steps of batch "
          f"8; gradient checkpointing {args.checkpointing}; {args.pairs} pairs; work dir {work}")
    for name, outcome in in_child("--child", "probe", "--work", str(work), "--stages", ",".join(stages)).items():
        if name != "wall":
            print(f"probe: {name}: {outcome}")
    lines = ["| stage | trainer | final train loss | wall ms/step, median (range) | CPU ms/step, median (range) | "
             "training's peak memory above its start, MiB (RSS; on CUDA the GPU's) | process peak RSS, MiB |",
             "|---|---|---|---|---|---|---|"]
    for stage in stages:
        lines += report(stage, measure(stage, work, args.steps, args.pairs, args.checkpointing))
    print("\n".join(lines))

if __name__ == "__main__":
    main()
