"""tuneline against LLaMA-Factory, the same YAML through both: `make bench` (`python benchmarks/bench.py [--pairs
sft-lora,...] [--repeats 3] [--steps 30] [--no-extras] [--workdir DIR]`).

LLaMA-Factory 0.9.5 runs from `.venv-peer` (the Makefile's `bench` target makes it; its pins clash with ours). Both
systems get one YAML per pair, written here: LLaMA-Factory's key names and demo data (tests/fixtures/llamafactory),
a Llama of hidden 256 and 4 layers built offline with a tokenizer trained on that data (so the step's matmuls, not
the framework, set the pace; sft-vlm: mllm_demo replicated to 200 rows, each copy with its own image files, and
the tiny llava of `tuneline tiny-model --preset llava` with the llava template), and the same cutoff_len, batch,
accumulation, steps, seed, learning rate, gradient checkpointing and `val_size: 0.1` (both hold out the same rows; ours evaluates on them, LLaMA-Factory's examples
set no `eval_strategy`, so it does not). The YAML differs only in the keys one system lacks (ours: the step cache, the MLflow store;
theirs: `do_train`, `report_to: none`), and in what each does by default beyond training: ours evaluates the base
and the tuned model (`eval_max_samples` rows of the held-out part) and records everything in MLflow.

Each pair runs `--repeats` rounds, the two systems alternating (which goes first alternates too), so drift on a
shared machine falls on both. Each run starts from nothing (fresh caches, output_dir, datasets cache) and its
output lines are timestamped as they arrive, which gives the parts of its wall time:
- preprocessing: ours, the `build-dataset` step (after `load-tokenizer`); theirs, from "Loading dataset" to the
  first tokenized example it prints. Ours' `build-reference-model` (reference log-probs, dpo/kto) is its own
  column: LLaMA-Factory computes them inside its training loop.
- training: the Trainer's `train_runtime` (all_results.json); tokens/s = its non-padding `num_input_tokens_seen`
  over that time; final loss = the last logged `loss` of trainer_log.jsonl.
- evaluation (ours only): from the end of `train` to the end of `evaluate tuned`.
- peak RSS: the whole process tree's resident memory, sampled every 0.2 s.
Ratios are ours / theirs of the medians. Extras (SFT LoRA, `--no-extras` skips them): the same command run again
unchanged (ours: every step cached; theirs: trains again), and a run killed (SIGKILL of its process group) after
the checkpoint at half the steps, then the same command again (theirs with `overwrite_output_dir: false`, so it
resumes from that checkpoint as LLaMA-Factory documents).

Ours runs against a `prefect server start` the script starts on 127.0.0.1 (how a scheduled retrain runs);
Prefect's temporary server, a plain `tuneline train` with no server, costs more per command (orchestration_overhead
.py measures it). Results go to benchmarks/results/latest.md and latest.json (with the machine) and are printed.
The grpo row (`--grpo-steps 0` skips it) is not paired with LLaMA-Factory, which has no GRPO: grpo_vs_trl.py runs
our grpo flow against a plain script calling trl's GRPOTrainer on the same model, prompts, rewards and seed.
Figures only: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PEER = REPO / ".venv-peer" / "bin"
LF_DATA = REPO / "tests" / "fixtures" / "llamafactory" / "0.9.5" / "data"
RESULTS = REPO / "benchmarks" / "results"
MODEL_SIZES = {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 4,
               "num_key_value_heads": 4, "vocab_size": 4096, "max_position_embeddings": 2048}
LORA = {"finetuning_type": "lora", "lora_rank": 8, "lora_target": "all"}
PAIRS = {  # name -> keys on top of the shared ones (LLaMA-Factory's examples' values where they have one)
    "sft-lora": {"stage": "sft", "dataset": "identity,alpaca_en_demo", "learning_rate": 1e-4, **LORA},
    "sft-full": {"stage": "sft", "dataset": "identity,alpaca_en_demo", "learning_rate": 1e-5,
                 "finetuning_type": "full"},
    "sft-packed": {"stage": "sft", "dataset": "identity,alpaca_en_demo", "learning_rate": 1e-4, "packing": True,
                   **LORA},
    "dpo-lora": {"stage": "dpo", "dataset": "dpo_en_demo", "learning_rate": 5e-6, "pref_beta": 0.1, **LORA},
    "dpo-full": {"stage": "dpo", "dataset": "dpo_en_demo", "learning_rate": 5e-6, "pref_beta": 0.1,
                 "finetuning_type": "full"},
    "kto-lora": {"stage": "kto", "dataset": "kto_en_demo", "learning_rate": 5e-6, "pref_beta": 0.1, **LORA},
    "rm-lora": {"stage": "rm", "dataset": "dpo_en_demo", "learning_rate": 1e-4, **LORA},
    # batch 4 x 1 (the others' 4 rows a step): with accumulation, LLaMA-Factory turns off transformers' token-count
    # loss for any model with a processor (sft/trainer.py, `model_accepts_loss_kwargs = False`), tuneline keeps it
    "sft-vlm": {"stage": "sft", "dataset": "mllm_bench", "template": "llava", "learning_rate": 1e-4,
                "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, **LORA},
}
PAIR_MODELS = {"sft-vlm": "vlm-llava"}  # pair -> its model folder in the workdir (others: "model", the text Llama)
VLM_ROWS = 200  # mllm_demo's 6 rows replicated (each copy with its own image files) as dataset "mllm_bench"
OURS_ONLY = ("pipeline_cache_dir", "mlflow_tracking_uri", "mlflow_experiment")
PPO_NOTE = ("ppo: not paired. LLaMA-Factory 0.9.5's PPO trainer needs trl's PPO classes, which no trl release it "
            "accepts still has (trl 0.24 in .venv-peer has none), so it cannot run.")


def shared_keys(work: Path, steps: int, checkpointing: bool) -> dict:
    return {"model_name_or_path": str(work / "model"), "template": "qwen3_nothink", "dataset_dir": str(work / "data"),
            "cutoff_len": 1024, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2,
            "max_steps": steps, "logging_steps": 5, "save_strategy": "no", "lr_scheduler_type": "cosine",
            "warmup_ratio": 0.1, "seed": 42, "dataloader_num_workers": 0, "overwrite_output_dir": True, "val_size": 0.1,
            "include_num_input_tokens_seen": "non_padding", "disable_gradient_checkpointing": not checkpointing}


def write_config(work: Path, system: str, pair: str, keys: dict, tag: str) -> tuple[Path, Path]:
    """The pair's YAML for one system and one run (its own output_dir and, for ours, caches and MLflow store)."""
    run_dir = work / "runs" / f"{pair}-{system}-{tag}"
    values = {**keys, **PAIRS[pair], "output_dir": str(run_dir / "out"),
              "model_name_or_path": str(work / PAIR_MODELS.get(pair, "model"))}
    if system == "tuneline":
        values.update(pipeline_cache_dir=str(run_dir / "cache"), mlflow_tracking_uri=f"sqlite:///{run_dir}/mlflow.db",
                      mlflow_experiment="bench")
    else:
        values = {k: v for k, v in values.items() if k not in OURS_ONLY} | {"do_train": True, "report_to": "none"}
    run_dir.mkdir(parents=True, exist_ok=True)
    config = run_dir / "config.yaml"
    config.write_text(yaml.safe_dump(values, sort_keys=False))
    return config, run_dir


class TimedRun:
    """One command with its output lines timestamped on arrival and its process tree's RSS sampled."""

    def __init__(self, command: list[str], env: dict, cwd: Path, log: Path):
        self.lines: list[tuple[float, str]] = []
        self.peak_rss = 0
        self.start = time.perf_counter()
        self.proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.log = log.open("wb")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        threading.Thread(target=self._sample, daemon=True).start()

    def _read(self) -> None:
        pending = b""
        for chunk in iter(lambda: self.proc.stdout.read1(65536), b""):
            self.log.write(chunk)
            parts = re.split(rb"[\r\n]", pending + chunk)
            pending = parts.pop()
            now = time.perf_counter() - self.start
            self.lines.extend((now, p.decode(errors="replace")) for p in parts if p.strip())

    def _sample(self) -> None:
        root = psutil.Process(self.proc.pid)
        while self.proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                tree = [root, *root.children(recursive=True)]
                self.peak_rss = max(self.peak_rss, sum(p.memory_info().rss for p in tree if p.is_running()))
            time.sleep(0.2)

    def wait(self) -> tuple[int, float]:
        code = self.proc.wait()
        wall = time.perf_counter() - self.start
        self._reader.join(timeout=10)
        self.log.close()
        return code, wall

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def first(self, pattern: str) -> float | None:
        return next((t for t, line in self.lines if re.search(pattern, line)), None)


def task_done(name: str) -> str:
    return rf"Task run '{name}[^']*' - Finished in state"


def parts_of(run: TimedRun, system: str) -> dict:
    """Preprocessing, reference and evaluation seconds from the timestamped lines (None where a marker is absent)."""
    def between(a: str, b: str) -> float | None:
        start, end = run.first(a), run.first(b)
        return end - start if start is not None and end is not None and end >= start else None

    if system == "llamafactory":
        return {"preprocess_s": between(r"Loading dataset", r"^(chosen_)?input_ids:")}
    return {"preprocess_s": between(task_done("load-tokenizer"), task_done("build-dataset")),
            "reference_s": between(task_done("build-dataset"), task_done("build-reference-model")),
            "eval_s": between(task_done("train"), task_done("evaluate tuned"))}


def training_figures(output_dir: Path) -> dict:
    results = json.loads((output_dir / "all_results.json").read_text())
    logged = [json.loads(line) for line in (output_dir / "trainer_log.jsonl").read_text().splitlines() if line.strip()]
    losses = [e["loss"] for e in logged if e.get("loss") is not None]
    tokens = results.get("num_input_tokens_seen")
    return {"train_s": results["train_runtime"], "tokens": tokens, "loss": losses[-1] if losses else None,
            "tokens_per_s": tokens / results["train_runtime"] if tokens else None,
            "steps": max((e.get("current_steps", 0) for e in logged), default=0)}


def command_for(system: str, config: Path) -> list[str]:
    return [str(PEER / "llamafactory-cli"), "train", str(config)] if system == "llamafactory" else \
        [str(BIN / "tuneline"), "train", str(config)]


def environment(system: str, run_dir: Path, prefect_env: dict) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "",
           "HF_DATASETS_CACHE": str(run_dir / "hf-datasets"), "HF_HUB_OFFLINE": "1"}
    if system == "tuneline":
        env.update(prefect_env)
    else:
        env.update(DISABLE_VERSION_CHECK="1", FORCE_TORCHRUN="0")
    return env


def run_once(work: Path, system: str, pair: str, keys: dict, tag: str, prefect_env: dict,
             kill_after_step: int | None = None) -> dict:
    """One whole command; with `kill_after_step`, SIGKILL once trainer_log.jsonl shows that step."""
    config, run_dir = write_config(work, system, pair, keys, tag)
    return run_config(system, pair, config, run_dir, prefect_env, kill_after_step, tag)


def run_config(system: str, pair: str, config: Path, run_dir: Path, prefect_env: dict,
               kill_after_step: int | None = None, tag: str = "") -> dict:
    output_dir = Path(yaml.safe_load(config.read_text())["output_dir"])
    log = run_dir / f"{system}-{tag}-{int(time.time())}.log"
    run = TimedRun(command_for(system, config), environment(system, run_dir, prefect_env), run_dir, log)
    try:
        while kill_after_step is not None and run.proc.poll() is None and logged_step(output_dir) < kill_after_step:
            time.sleep(0.2)
        if kill_after_step is not None:
            run.kill()
        code, wall = run.wait()
    except BaseException:  # interrupted (Ctrl+C, SIGTERM): no run left behind
        run.kill()
        raise
    row = {"pair": pair, "system": system, "tag": tag, "wall_s": wall, "peak_rss_mb": run.peak_rss / 2**20,
           "exit": code, "log": str(log), **parts_of(run, system),
           "resumed": run.first(r"[Rr]esum(ing|ed|es) (training )?from") is not None}
    if kill_after_step is None and code == 0 and (output_dir / "all_results.json").is_file():
        row.update(training_figures(output_dir))
    elif kill_after_step is None:
        row["error"] = next((line for _, line in reversed(run.lines) if line.strip()), "no output")[:200]
    return row


def logged_step(output_dir: Path) -> int:
    path = output_dir / "trainer_log.jsonl"
    with contextlib.suppress(OSError, ValueError):
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        return json.loads(lines[-1]).get("current_steps", 0) if lines else 0
    return 0


@contextlib.contextmanager
def prefect_server(work: Path):
    """`prefect server start` on a free port of 127.0.0.1, its own home: the environment that points at it."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = work / "prefect-home"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    server = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    try:
        for _ in range(240):
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            time.sleep(0.5)
        else:
            raise SystemExit("prefect server did not answer in 120 s")
        yield {"PREFECT_API_URL": url, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def prepare(work: Path, pairs: list[str]) -> None:
    """LLaMA-Factory's demo data, and the model with a tokenizer trained on it (built offline, once); for sft-vlm,
    mllm_demo replicated and the tiny llava (`tuneline tiny-model --preset llava`)."""
    from mm_throughput import write_mm_data

    from tuneline.demo.tiny_model import build_tiny_model
    from tuneline.demo.tiny_vlm import build_tiny_vlm

    data = work / "data"
    if not data.is_dir():
        shutil.copytree(LF_DATA, data)
    if not (work / "model" / "config.json").is_file():
        build_tiny_model(work / "model", **MODEL_SIZES, corpus_dir=data)
    if "sft-vlm" in pairs and not (work / "vlm-llava" / "config.json").is_file():
        write_mm_data(data, VLM_ROWS, "mllm_bench")
        build_tiny_vlm(work / "vlm-llava", "llava")


def median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


COLUMNS = (("wall_s", "wall s", ".1f"), ("preprocess_s", "preprocess s", ".1f"), ("reference_s", "reference s", ".1f"),
           ("eval_s", "eval s", ".1f"), ("train_s", "train s", ".1f"), ("tokens_per_s", "tokens/s", ".0f"),
           ("peak_rss_mb", "peak RSS MB", ".0f"), ("loss", "final loss", ".4f"))


def summary(rows: list[dict]) -> list[dict]:
    """Per pair and system: medians; per pair: ours / theirs."""
    out = []
    for pair in dict.fromkeys(r["pair"] for r in rows if r["tag"].startswith("r")):
        mine = {system: [r for r in rows if r["pair"] == pair and r["system"] == system and r["tag"].startswith("r")]
                for system in ("tuneline", "llamafactory")}
        medians = {s: {key: median(runs, key) for key, _, _ in COLUMNS} for s, runs in mine.items()}
        ratio = {key: medians["tuneline"][key] / medians["llamafactory"][key]
                 for key, _, _ in COLUMNS if medians["tuneline"][key] and medians["llamafactory"][key]}
        errors = sorted({r["error"] for runs in mine.values() for r in runs if r.get("error")})
        out.append({"pair": pair, "runs": {s: len(v) for s, v in mine.items()}, "median": medians, "ratio": ratio,
                    "errors": errors})
    return out


def _cell(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def grpo_lines(grpo: dict | None) -> list[str]:
    if not grpo:
        return []
    curve = ", ".join(f"{step}: {ours:.3f}/{_cell(theirs, '.3f')}" for step, ours, theirs in grpo["curve"])
    return ["", "| grpo-lora vs plain trl | wall s | train s |", "|---|---|---|",
            f"| tuneline (flow) | {grpo['ours_wall_s']:.1f} | {grpo['ours_train_s']:.1f} |",
            f"| plain trl GRPOTrainer script | {grpo['plain_wall_s']:.1f} | {grpo['plain_train_s']:.1f} |",
            f"| tuneline's extra per run | {grpo['extra_wall_s']:.1f} | |", "",
            f"Mean reward by step, tuneline/trl ({grpo['steps']} steps; largest gap "
            f"{_cell(grpo['max_reward_gap'], '.4f')}): {curve}"]


def markdown(meta: dict, pairs: list[dict], extras: list[dict], grpo: dict | None = None) -> str:
    head = "| pair | system | " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    lines = [f"# tuneline vs LLaMA-Factory ({meta['date']})", "",
             f"{meta['machine']}; {meta['versions']}; {meta['settings']}", "",
             "Medians of the runs; `ratio` is ours / theirs (below 1: ours is smaller). `loss Δ` is the final loss's "
             "relative difference.", "", head, "|" + "---|" * (len(COLUMNS) + 2)]
    for p in pairs:
        for system in ("tuneline", "llamafactory"):
            m = p["median"][system]
            lines.append(f"| {p['pair']} | {system} ({p['runs'][system]}) | "
                         + " | ".join(_cell(m[key], spec) for key, _, spec in COLUMNS) + " |")
        loss = (p["median"]["tuneline"]["loss"], p["median"]["llamafactory"]["loss"])
        delta = abs(loss[0] - loss[1]) / abs(loss[1]) if None not in loss and loss[1] else None
        lines.append(f"| {p['pair']} | **ratio** | " + " | ".join(
            (f"loss Δ {delta:.2%}" if delta is not None else "-") if key == "loss" else _cell(p["ratio"].get(key), ".2f")
            for key, _, _ in COLUMNS) + " |")
        lines += [f"| {p['pair']} | error | {e} |" for e in p["errors"]]
    lines += ["", PPO_NOTE]
    if extras:
        lines += ["", "| extra | system | wall s | resumed | final loss | note |", "|---|---|---|---|---|---|"]
        lines += [f"| {e['what']} | {e['system']} | {_cell(e.get('wall_s'), '.1f')} | {e.get('resumed', '-')} | "
                  f"{_cell(e.get('loss'), '.4f')} | {e.get('note', '')} |" for e in extras]
    return "\n".join(lines + grpo_lines(grpo)) + "\n"


def machine() -> dict:
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    peer = subprocess.run([str(PEER / "python"), "-c", "import llamafactory, transformers, peft, trl, torch; print("
                           "f'llamafactory {llamafactory.__version__}, transformers {transformers.__version__}, "
                           "peft {peft.__version__}, trl {trl.__version__}, torch {torch.__version__}')"],
                          capture_output=True, text=True).stdout.strip()
    import peft
    import transformers

    from tuneline import __version__
    return {"machine": f"{os.cpu_count()} cores ({cpu}, {platform.machine()}), Python {platform.python_version()}",
            "versions": f"ours: tuneline {__version__}, transformers {transformers.__version__}, peft "
                        f"{peft.__version__}, torch {torch.__version__}; theirs: {peer}",
            "cores": os.cpu_count(), "cpu": cpu, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M")}


def extras_rows(work: Path, keys: dict, prefect_env: dict, steps: int) -> list[dict]:
    """SFT LoRA: the same command again unchanged; a kill after the half-way checkpoint, then the same command."""
    out = []
    for system in ("tuneline", "llamafactory"):
        config, run_dir = write_config(work, system, "sft-lora", keys, "again")
        first = run_config(system, "sft-lora", config, run_dir, prefect_env, tag="again-1")
        again = run_config(system, "sft-lora", config, run_dir, prefect_env, tag="again-2")
        out.append({"what": "unchanged re-run", "system": system, "wall_s": again["wall_s"], "loss": again.get("loss"),
                    "note": f"first run {first['wall_s']:.1f} s"})
    half = steps // 2
    crash_keys = {**keys, "save_strategy": "steps", "save_steps": half, "overwrite_output_dir": False}
    for system in ("tuneline", "llamafactory"):
        config, run_dir = write_config(work, system, "sft-lora", crash_keys, "crash")
        killed = run_config(system, "sft-lora", config, run_dir, prefect_env, kill_after_step=half + 5, tag="crash-1")
        rerun = run_config(system, "sft-lora", config, run_dir, prefect_env, tag="crash-2")
        out.append({"what": f"killed after step {half + 5} of {steps}, same command again", "system": system,
                    "wall_s": rerun["wall_s"], "resumed": rerun["resumed"], "loss": rerun.get("loss"),
                    "note": f"killed at {killed['wall_s']:.1f} s; kill to finished = the rerun's wall"})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", default=",".join(PAIRS), help="comma-separated, from: " + ", ".join(PAIRS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--checkpointing", action="store_true", help="gradient checkpointing on (both systems)")
    parser.add_argument("--no-extras", action="store_true", help="skip the re-run and crash rows")
    parser.add_argument("--grpo-steps", type=int, default=20, help="steps of the grpo-vs-trl row; 0 skips it")
    parser.add_argument("--workdir", type=Path, help="kept afterwards (default: a temporary folder)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the servers and runs started here are stopped
    if not (PEER / "llamafactory-cli").is_file():
        sys.exit(f"{PEER / 'llamafactory-cli'} is missing: `make bench` creates .venv-peer first")
    names = [n.strip() for n in args.pairs.split(",") if n.strip()]
    if unknown := [n for n in names if n not in PAIRS]:
        sys.exit(f"--pairs: unknown {', '.join(unknown)}; choose from {', '.join(PAIRS)}")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tuneline-bench-"))
    prepare(work, names)
    keys = shared_keys(work, args.steps, args.checkpointing)
    meta = {**machine(), "settings": f"{args.steps} steps of batch 2 x accumulation 2, cutoff_len 1024, gradient "
            f"checkpointing {'on' if args.checkpointing else 'off'}, hidden 256 x 4 layers (sft-vlm: the tiny llava, batch 4 x 1), "
            f"median of {args.repeats}"}
    rows: list[dict] = []
    with prefect_server(work) as prefect_env:
        for round_no in range(args.repeats):
            for i, pair in enumerate(names):
                order = ("tuneline", "llamafactory") if (round_no + i) % 2 == 0 else ("llamafactory", "tuneline")
                for system in order:
                    row = run_once(work, system, pair, keys, f"r{round_no}", prefect_env)
                    rows.append(row)
                    print(f"round {round_no + 1} {pair} {system}: wall {row['wall_s']:.1f} s, train "
                          f"{_cell(row.get('train_s'), '.1f')} s, loss {_cell(row.get('loss'), '.4f')}"
                          f"{' ERROR ' + row['error'] if row.get('error') else ''}", flush=True)
        extras = [] if args.no_extras else extras_rows(work, keys, prefect_env, args.steps)
        grpo = None
        if args.grpo_steps:
            from grpo_vs_trl import grpo_comparison

            grpo = grpo_comparison(work / "grpo", args.grpo_steps, prefect_env)
    pairs = summary(rows)
    table = markdown(meta, pairs, extras, grpo)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "latest.md").write_text(table)
    (args.results / "latest.json").write_text(json.dumps({"meta": meta, "pairs": pairs, "extras": extras,
                                                          "grpo": grpo, "runs": rows}, indent=2))
    print(table)
    print(f"written: {args.results / 'latest.md'}, {args.results / 'latest.json'}; runs kept in {work}")


if __name__ == "__main__":
    main()
