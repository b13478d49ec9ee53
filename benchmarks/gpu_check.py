"""GPU check: `python benchmarks/gpu_check.py [--steps 30] [--cases sft-lora,...] [--systems tuneline,llamafactory]
[--llamafactory-site DIR] [--time-budget 540] [--peak-tflops N] [--batching] [--dry-run] [--device cpu] [--preset P]`
(`make gpu-check` installs a wheelhouse from benchmarks/gpu_wheelhouse.py and runs it).

For a CUDA machine. Builds a Llama of about half a billion parameters offline (`tuneline tiny-model --preset half-b`:
random weights, the tiny tokenizer) and a tiny Qwen3-VL, then trains them through `tuneline train` (one subprocess
per case, the command a user runs: Prefect's temporary server, MLflow on SQLite): bf16 sft LoRA and full, full sft
under ZeRO-3, dpo LoRA with the reference log-probs precomputed, grpo LoRA, Qwen3-VL sft on LLaMA-Factory's image
demo and on its video demo, sft LoRA with `enable_liger_kernel` and full sft with `fp8` (and with --cases: ZeRO-2,
QLoRA, Qwen3-VL dpo). Then the same YAMLs through LLaMA-Factory 0.9.5's `llamafactory-cli train`: from a target
folder (`--llamafactory-site`, the wheelhouse's second load) or `.venv-peer`. A case that cannot run is listed with
why: a key tuneline refuses (its message), a package missing (PyAV, DeepSpeed, bitsandbytes), a stage LLaMA-Factory
lacks, the time budget spent. Each case runs `--steps` steps; its figures come from the run's trainer_log.jsonl:
tokens/s and seconds per step between the first and the last logged step (the steps before the first log line are
warm-up), train_results.json's runtime, peak GPU memory (`peak_gpu_memory_mb`: torch.cuda.max_memory_allocated of
the training process), the final loss, and the whole command's wall time.

Model FLOPs utilisation = flops_per_token x tokens/s / the card's dense bf16 peak, with flops_per_token = 6 x N for
full tuning (forward 2N, input gradients 2N, weight gradients 2N; Kaplan's 6N) and 4 x N for LoRA, QLoRA and dpo
LoRA (the frozen weights get no gradient), where N counts the weights of every Linear layer (lm_head included,
embeddings not); attention's own FLOPs are not counted, so long sequences read low. The peaks come from a small
table by GPU name (`--peak-tflops` for any other card). dpo counts the tokens of both answers of each pair.
LLaMA-Factory counts padding in its tokens: s/step is the figure to compare across the two.

`--batching` first runs `benchmarks/batching.py` and `benchmarks/vision_check.py`. `--dry-run` writes and validates
every case's config and data and prints the plan, with no model and no training; `--device cpu` trains on the CPU
(fp32), for checking the whole path. Figures only: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PEER_CLI = REPO / ".venv-peer" / "bin" / "llamafactory-cli"
# Dense bf16 tensor-core peaks from NVIDIA's datasheets, matched in order against torch's device name.
PEAK_BF16_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("A100", 312.0), ("L40S", 362.0))
LORA = {"finetuning_type": "lora", "lora_rank": 16, "lora_target": "all", "learning_rate": 1e-4}
FULL = {"finetuning_type": "full", "learning_rate": 1e-5}
SFT = {"stage": "sft", "dataset": "gpu_sft", "packing": True}
GRPO = {"stage": "grpo", "dataset": "demo_sft", "num_generations": 8, "max_completion_length": 64, "beta": 0.0,
        "reward_funcs": [f"{REPO / 'examples' / 'grpo_demo_rewards.py'}:digit_share"]}
CASES = {  # name -> keys on top of the shared ones
    "sft-lora": {**SFT, **LORA},
    "sft-full": {**SFT, **FULL},
    "sft-full-zero2": {**SFT, **FULL, "deepspeed": str(REPO / "examples" / "deepspeed" / "ds_z2_config.json")},
    "sft-full-zero3": {**SFT, **FULL, "deepspeed": str(REPO / "examples" / "deepspeed" / "ds_z3_config.json")},
    "dpo-lora": {"stage": "dpo", "dataset": "demo_pref", "pref_beta": 0.1, "precompute_ref": True, **LORA},
    "grpo-lora": {**GRPO, **LORA},
    "sft-lora-liger": {**SFT, **LORA, "enable_liger_kernel": True},
    "sft-full-fp8": {**SFT, **FULL, "fp8": True},
    "sft-qlora": {**SFT, "quantization_bit": 4, **LORA},
}
# Qwen3-VL end to end through `tuneline train` (tiny preset; LLaMA-Factory's image and video demo, its rlhf_v pairs):
# where torchvision (and for videos PyAV) load, the command a user runs. No MFU: the model is tiny.
VLM_DATA = REPO / "tests" / "fixtures" / "llamafactory-mm"
VLM = {"vlm_preset": "qwen3_vl", "template": "qwen3_vl_nothink", "dataset_dir": str(VLM_DATA), "cutoff_len": 4096,
       "per_device_train_batch_size": 2, **LORA}
CASES.update({
    "sft-qwen3vl-images": {"stage": "sft", "dataset": "mllm_demo", **VLM},
    "sft-qwen3vl-videos": {"stage": "sft", "dataset": "mllm_video_demo", **VLM},
    "dpo-qwen3vl": {"stage": "dpo", "dataset": "rlhf_v", "pref_beta": 0.1, **VLM},
})
# `make gpu-check`'s cases; the others run when --cases names them.
DEFAULT_CASES = ("sft-lora", "sft-full", "sft-full-zero3", "dpo-lora", "grpo-lora", "sft-qwen3vl-images",
                 "sft-qwen3vl-videos", "sft-lora-liger", "sft-full-fp8")
# What LLaMA-Factory 0.9.5 cannot run, by case: its side says so instead of failing.
NOT_IN_LLAMAFACTORY = {"grpo-lora": "LLaMA-Factory 0.9.5 has no grpo stage"}
TUNELINE_ONLY = ("pipeline_cache_dir", "mlflow_tracking_uri", "mlflow_experiment", "precompute_ref")


def peak_tflops(device_name: str, given: float | None) -> float | None:
    """The card's dense bf16 peak: `--peak-tflops` when given, else the table's entry for its name, else None."""
    if given:
        return given
    return next((peak for key, peak in PEAK_BF16_TFLOPS if key.lower() in device_name.lower()), None)


def flops_per_token(linear_weights: int, case: dict) -> int:
    """6N for full tuning, 4N where the base weights are frozen (see the module docstring); 0 (no MFU) for the
    vision-language cases, whose model is not the one counted."""
    if "vlm_preset" in case:
        return 0
    return (6 if case.get("finetuning_type") == "full" else 4) * linear_weights


def mfu(tokens_per_s: float | None, per_token: int, peak: float | None) -> float | None:
    """Model FLOPs utilisation as a fraction of `peak` TFLOPS; None when either is unknown."""
    if not tokens_per_s or not peak or not per_token:
        return None
    return per_token * tokens_per_s / (peak * 1e12)


def linear_weights(model_dir: Path) -> int:
    """Weights of the model's Linear layers, counted on the meta device (nothing allocated)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def installed(package: str, system: str, site: Path | None) -> bool:
    """Whether `package` imports where `system` runs: this process, or LLaMA-Factory's target folder or venv."""
    if system == "llamafactory":
        folders = [site] if site is not None else list(PEER_CLI.parent.parent.glob("lib/python3*/site-packages"))
        return any((folder / package).is_dir() for folder in folders)
    return importlib.util.find_spec(package) is not None


def skip_reason(name: str, device: str, system: str = "tuneline", site: Path | None = None) -> str | None:
    """Why a case cannot run here (a package or the device), said before anything starts."""
    from tuneline.data.mm.requirements import video_requirements_problem

    case = CASES[name]
    if "video" in case["dataset"] and (problem := video_requirements_problem()):
        return problem
    if case.get("quantization_bit") and device != "cuda":
        return "QLoRA needs CUDA"
    if case.get("quantization_bit") and not installed("bitsandbytes", system, site):
        return "bitsandbytes is not installed (pip install bitsandbytes)"
    if case.get("deepspeed") and not installed("deepspeed", system, site):
        return "deepspeed is not installed"
    if case.get("fp8") and device != "cuda":
        return "fp8 needs a CUDA card of compute capability 8.9 or more"
    return None


def case_config(work: Path, name: str, steps: int, device: str, system: str = "tuneline") -> dict:
    """The YAML keys of one case, the same for both systems except the keys only tuneline has."""
    values = {"model_name_or_path": str(work / "model"), "template": "qwen", "dataset_dir": str(work / "data"),
              "cutoff_len": 1024, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
              "max_steps": steps, "logging_steps": max(1, min(10, steps // 5)), "save_strategy": "no",
              "lr_scheduler_type": "cosine", "warmup_ratio": 0.05, "seed": 42, "bf16": device == "cuda",
              "dataloader_num_workers": 2, "preprocessing_num_workers": 4, "overwrite_output_dir": True,
              "output_dir": str(work / "out" / system / name), "pipeline_cache_dir": str(work / "cache"),
              "mlflow_tracking_uri": f"sqlite:///{work / 'mlflow.db'}", "mlflow_experiment": "gpu-check",
              **CASES[name]}
    if preset := values.pop("vlm_preset", None):
        values["model_name_or_path"] = str(work / "vlm" / preset)
    if device == "cpu":
        values.update(use_cpu=True, dataloader_num_workers=0)
    if system == "llamafactory":
        values = {k: v for k, v in values.items() if k not in TUNELINE_ONLY}
        values.update(do_train=True, report_to="none", include_num_input_tokens_seen=True)
    return values


def write_config(work: Path, name: str, values: dict, system: str) -> Path:
    path = work / "configs" / system / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {system} case '{name}' of benchmarks/gpu_check.py\n" + yaml.safe_dump(values, sort_keys=False))
    return path


def prepare_data(work: Path) -> None:
    """Synthetic alpaca-style rows for sft (train_throughput's generator); the demo preference pairs for dpo and the
    demo sft rows, whose answers the grpo reward reads, for grpo."""
    sys.path.insert(0, str(Path(__file__).parent))
    from train_throughput import alpaca_rows

    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "gpu_sft.json").write_text(json.dumps(alpaca_rows(4000)))
    info = json.loads((REPO / "data" / "dataset_info.json").read_text())
    for name in ("demo_pref", "demo_sft"):
        (data / info[name]["file_name"]).write_text((REPO / "data" / info[name]["file_name"]).read_text())
    (data / "dataset_info.json").write_text(json.dumps({"gpu_sft": {"file_name": "gpu_sft.json"},
                                                        "demo_pref": info["demo_pref"], "demo_sft": info["demo_sft"]},
                                                       indent=2))


def _seconds(value) -> float | None:
    """trainer_log's elapsed_time: seconds (tuneline) or "H:MM:SS" (LLaMA-Factory, whole seconds)."""
    if isinstance(value, str):
        hours, minutes, seconds = value.split(":")
        return 3600 * int(hours) + 60 * int(minutes) + float(seconds)
    return value


def read_training(output_dir: Path) -> dict:
    """Steps, steady tokens/s and s/step, training seconds, peak GPU memory and final loss from a run's
    trainer_log.jsonl (and train_results.json's train_runtime where the run wrote one). Each system counts its own
    tokens: LLaMA-Factory's `include_num_input_tokens_seen` counts padding too, so s/step is the like-for-like one."""
    lines = [json.loads(line) for line in (output_dir / "trainer_log.jsonl").read_text().splitlines() if line.strip()]
    for line in lines:
        line["elapsed_time"] = _seconds(line.get("elapsed_time"))
    timed = [e for e in lines if e.get("total_tokens") and e.get("elapsed_time")]
    # from the first log line on: the steps before it (allocator growth, kernel choice) are warm-up
    first, last = (timed[0] if len(timed) > 1 else None), (timed[-1] if timed else None)
    step_s = None
    if first and last["elapsed_time"] > first["elapsed_time"]:
        window = last["elapsed_time"] - first["elapsed_time"]
        tokens_per_s = (last["total_tokens"] - first["total_tokens"]) / window
        step_s = window / max(1, last["current_steps"] - first["current_steps"])
    else:
        tokens_per_s = last["total_tokens"] / last["elapsed_time"] if last else None
    memory = [e["peak_gpu_memory_mb"] for e in lines if e.get("peak_gpu_memory_mb")]
    losses = [e.get("train_loss", e.get("loss")) for e in lines if e.get("train_loss", e.get("loss")) is not None]
    results = output_dir / "train_results.json"
    runtime = json.loads(results.read_text()).get("train_runtime") if results.is_file() else None
    return {"steps": max((e.get("current_steps", 0) for e in lines), default=0), "tokens_per_s": tokens_per_s,
            "step_s": step_s, "train_s": runtime or (last["elapsed_time"] if last else None),
            "peak_gpu_mb": max(memory) if memory else None, "loss": losses[-1] if losses else None}


def llamafactory_command(site: Path | None) -> list[str] | None:
    """How LLaMA-Factory's `train` is started: from a wheelhouse's target folder (`--llamafactory-site`, on the GPU
    machine), else .venv-peer's `llamafactory-cli`; None where neither is there."""
    if site is not None:
        if not (site / "llamafactory").is_dir():
            return None
        return [sys.executable, "-c", "import sys; from llamafactory.cli import main; sys.argv[0] = "
                "'llamafactory-cli'; sys.exit(main())"]
    return [str(PEER_CLI)] if PEER_CLI.is_file() else None


def error_line(output: str) -> str:
    """The line that says what went wrong: tuneline's own `error: ...` message, else the first exception's
    `SomeError: ...` line (a temporary server's shutdown noise follows it), else the last line."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    told = [line for line in lines if line.startswith("error:")]
    raised = [line for line in lines if re.match(r"\w*(Error|Exception)\b:", line)]
    return (told[-1:] or raised[:1] or lines[-1:] or ["no output"])[0]


def run_case(work: Path, name: str, config: Path, system: str, device: str, peer: list[str] | None = None,
             site: Path | None = None) -> dict:
    """One `tuneline train` (or `llamafactory-cli train`) of a case; its figures, or the error's last lines."""
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    # a wheelhouse installed with --no-compile imports slowly at its first start: Prefect's 20 s are not enough
    env.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    if device == "cpu":  # LLaMA-Factory counts GPUs for torchrun's processes: one on the CPU
        env.update(CUDA_VISIBLE_DEVICES="", NPROC_PER_NODE="1")
    if system == "llamafactory":
        command = [*peer, "train", str(config)]
        env["FORCE_TORCHRUN"] = "1" if CASES[name].get("deepspeed") else env.get("FORCE_TORCHRUN", "0")
        if site is not None:  # LLaMA-Factory's pins (transformers 5.6) before the image's, and none of ours
            env["PYTHONPATH"] = str(site)
        else:  # its DeepSpeed runs start `torchrun`, found on PATH: .venv-peer's own
            env["PATH"] = os.pathsep.join((str(PEER_CLI.parent), env.get("PATH", "")))
    else:
        command = [sys.executable, "-m", "cli.main", "train", str(config)]
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True)
    row = {"case": name, "system": system, "wall_s": time.perf_counter() - start}
    output_dir = work / "out" / system / name
    if proc.returncode or not (output_dir / "trainer_log.jsonl").is_file():
        (work / f"{system}-{name}.log").write_text(proc.stdout + proc.stderr)
        return {**row, "error": [error_line(proc.stdout + proc.stderr)]}
    return {**row, **read_training(output_dir)}


def _cell(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def results_table(rows: list[dict], per_token: dict[str, int], peak: float | None) -> str:
    """The printed table: one line per case and system, MFU against `peak` TFLOPS."""
    lines = ["| case | system | steps | wall s | train s | s/step | tokens/s | MFU % | peak GPU GiB | loss | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        util = mfu(r.get("tokens_per_s"), per_token.get(r["case"], 0), peak)
        memory = r["peak_gpu_mb"] / 1024 if r.get("peak_gpu_mb") else None
        note = r.get("skipped") or " ".join(r.get("error", []))[:120]
        lines.append(f"| {r['case']} | {r['system']} | {r.get('steps', '-')} | {_cell(r.get('wall_s'), '.0f')} | "
                     f"{_cell(r.get('train_s'), '.0f')} | {_cell(r.get('step_s'), '.3f')} | "
                     f"{_cell(r.get('tokens_per_s'), '.0f')} | "
                     f"{_cell(util and 100 * util, '.1f')} | {_cell(memory, '.2f')} | {_cell(r.get('loss'), '.4f')} | "
                     f"{note} |")
    return "\n".join(lines)


def device_name(device: str) -> str:
    import torch

    if device == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        sys.exit("no CUDA device here: run on a GPU machine, or use --dry-run / --device cpu to check the script")
    return torch.cuda.get_device_name(0)


def plan(work: Path, names: list[str], steps: int, device: str, systems: tuple[str, ...], peer: list[str] | None,
         skipped: dict[tuple[str, str], str]) -> list[tuple[str, str, Path]]:
    """(case, system, config) for every run, each config written and checked as `tuneline check` would; adds to
    `skipped` the pairs that cannot run, with the reason: a key tuneline refuses (its message), no LLaMA-Factory."""
    from tuneline.config import load_config
    from tuneline.errors import ConfigError

    runs = []
    prepare_data(work)
    for name in names:
        values = case_config(work, name, steps, device)
        known = json.loads((Path(values["dataset_dir"]) / "dataset_info.json").read_text())
        if missing := [d for d in values["dataset"].split(",") if d not in known]:
            raise SystemExit(f"gpu_check's case {name}: dataset {missing} is not in {values['dataset_dir']}")
        try:
            load_config(None, values, check_paths=False)
        except ConfigError as refused:  # a key not honoured yet (enable_liger_kernel, fp8): said, not failed
            skipped.setdefault((name, "tuneline"), f"tuneline refuses the config: {refused}")
        if "tuneline" in systems and (name, "tuneline") not in skipped:
            runs.append((name, "tuneline", write_config(work, name, values, "tuneline")))
        if "llamafactory" not in systems or (name, "llamafactory") in skipped:
            continue
        if reason := NOT_IN_LLAMAFACTORY.get(name) or (None if peer else "LLaMA-Factory is not installed"):
            skipped[(name, "llamafactory")] = reason
        else:
            runs.append((name, "llamafactory", write_config(
                work, name, case_config(work, name, steps, device, "llamafactory"), "llamafactory")))
    return runs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"comma-separated subset of {', '.join(CASES)}")
    parser.add_argument("--preset", default="half-b", help="tuneline.demo.tiny_model preset of the model built")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the card's dense bf16 peak, for MFU")
    parser.add_argument("--systems", default="tuneline,llamafactory", help="tuneline, llamafactory or both")
    parser.add_argument("--llamafactory-site", default=None, help="LLaMA-Factory installed into this target folder")
    parser.add_argument("--time-budget", type=float, default=540, help="seconds: later runs are skipped, saying so")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dry-run", action="store_true", help="write and check the configs, print the plan")
    parser.add_argument("--batching", action="store_true", help="first run benchmarks/batching.py and vision_check")
    parser.add_argument("--work", default=None, help="workspace folder (default: a temporary one)")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.cases.split(",")) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    if bad := set(args.systems.split(",")) - {"tuneline", "llamafactory"}:
        parser.error(f"unknown system(s) {', '.join(sorted(bad))}; choose from tuneline, llamafactory")
    return args


def print_plan(runs: list, skipped: dict) -> None:
    for (name, system), reason in skipped.items():
        print(f"{name} ({system}): skipped, {reason}")
    for name, system, config in runs:
        print(f"{name} ({system}): {'llamafactory-cli' if system == 'llamafactory' else 'tuneline'} train {config}")


def prepare_models(work: Path, preset: str, runs: list) -> int:
    """The models the runs need, built offline; the Linear weights of the text model, for MFU."""
    from tuneline.demo.tiny_model import TINY_PRESETS, build_tiny_model
    from tuneline.demo.tiny_vlm import build_tiny_vlm

    if not (work / "model" / "config.json").is_file():
        build_tiny_model(work / "model", **TINY_PRESETS[preset])
    for preset_name in {CASES[name].get("vlm_preset") for name, _, _ in runs} - {None}:
        if not (work / "vlm" / preset_name / "config.json").is_file():
            build_tiny_vlm(work / "vlm" / preset_name, preset_name)
    return linear_weights(work / "model")


def run_all(work: Path, runs: list, args: argparse.Namespace, peer: list[str] | None) -> list[dict]:
    """Every run in turn, until the time budget is spent: the runs after it are listed as skipped."""
    started, rows = time.perf_counter(), []
    site = Path(args.llamafactory_site).resolve() if args.llamafactory_site else None
    for name, system, config in runs:
        if time.perf_counter() - started > args.time_budget:
            rows.append({"case": name, "system": system, "skipped": f"over the {args.time_budget:.0f} s budget"})
            continue
        rows.append(run_case(work, name, config, system, args.device, peer, site))
        print(f"{name} ({system}): done in {rows[-1]['wall_s']:.0f} s", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="tuneline-gpu-check-")).resolve()
    names, systems = args.cases.split(","), tuple(args.systems.split(","))
    site = Path(args.llamafactory_site).resolve() if args.llamafactory_site else None
    peer = llamafactory_command(site)
    skipped = {(name, system): reason for name in names for system in systems
               if (reason := skip_reason(name, args.device, system, site))}
    runs = plan(work, names, args.steps, args.device, systems, peer, skipped)
    skipped = {pair: reason for pair, reason in skipped.items() if pair[1] in systems}
    print_plan(runs, skipped)
    if args.dry_run:
        return 0
    if args.batching:  # padded against padding-free batches per attention, and the vision families
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "batching.py"), "--device", args.device,
                        "--preset", args.preset, "--json", str(work / "batching.json")], check=False)
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "vision_check.py"), "--device", args.device],
                       check=False)
    gpu = device_name(args.device)
    peak = peak_tflops(gpu, args.peak_tflops)
    weights = prepare_models(work, args.preset, runs)
    rows = [{"case": name, "system": system, "skipped": reason} for (name, system), reason in skipped.items()]
    rows += run_all(work, runs, args, peer)
    rows.sort(key=lambda r: (names.index(r["case"]), r["system"]))
    table = results_table(rows, {name: flops_per_token(weights, CASES[name]) for name in CASES}, peak)
    result = json.dumps({"device": gpu, "peak_tflops": peak, "linear_weights": weights, "steps": args.steps,
                         "rows": rows}, indent=2)
    for path in {work / "gpu_check.json", *([Path(args.json)] if args.json else [])}:
        path.write_text(result)
    print(f"\n{gpu}; {weights / 1e6:.1f}M Linear weights; MFU against "
          f"{f'{peak:.0f} TFLOPS bf16' if peak else 'no known peak (pass --peak-tflops)'}\n{table}\n"
          f"workspace: {work}")
    failed = [r for r in rows if r.get("error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
