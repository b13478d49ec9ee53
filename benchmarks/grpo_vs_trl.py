"""tuneline's grpo against a plain script calling trl's GRPOTrainer: `python benchmarks/grpo_vs_trl.py [--steps 20]
[--workdir DIR]` (`make bench` runs it as its grpo row).

Both train the demo tiny model (`tuneline tiny-model --preset demo`) with LoRA (rank 16, alpha 32, every linear layer
of the blocks) on the same prompts (the `prompt` column tuneline's build-dataset step renders from demo_sft), the same
reward functions (examples/grpo_demo_rewards.py, weights 1.0 and 0.5), the same sampling and the same seed. The plain
script does what a trl user writes by hand: load the model, wrap it in peft, build GRPOConfig and GRPOTrainer, train.
Ours runs `tuneline train` (the flow: tokenizer, dataset, train, base and tuned evaluation, plot, model card, MLflow)
against a Prefect server started here. Printed: each logged step's mean reward from both (the same curve when both
sample the same answers), the training time each reports (`train_runtime`) and the wall time of each command, whose
difference is tuneline's extra time per run. Figures only: nothing here is asserted.
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

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EXAMPLE = REPO / "examples" / "grpo_lora_demo.yaml"

PLAIN_SCRIPT = '''
import json, sys, importlib.util
import torch
from datasets import load_from_disk
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
from trl import GRPOConfig, GRPOTrainer

cfg = json.loads(sys.argv[1])
spec = importlib.util.spec_from_file_location("rewards", cfg["rewards_file"])
rewards = importlib.util.module_from_spec(spec); spec.loader.exec_module(rewards)
tokenizer = AutoTokenizer.from_pretrained(cfg["model"])
prompts = load_from_disk(cfg["dataset"])["train"].select_columns(["prompt", "solution"])
set_seed(cfg["seed"])
model = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.float32)
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
args = GRPOConfig(output_dir=cfg["output_dir"], per_device_train_batch_size=cfg["batch"], max_steps=cfg["steps"],
    learning_rate=cfg["lr"], lr_scheduler_type="constant", logging_steps=cfg["logging_steps"], seed=cfg["seed"],
    num_generations=cfg["num_generations"], max_completion_length=cfg["max_completion_length"],
    temperature=cfg["temperature"], top_p=cfg["top_p"], top_k=cfg["top_k"], reward_weights=cfg["weights"],
    use_cpu=True, bf16=False, gradient_checkpointing=False, save_strategy="no", report_to="none")
trainer = GRPOTrainer(model=model, reward_funcs=[getattr(rewards, n) for n in cfg["functions"]], args=args,
                      train_dataset=prompts, processing_class=tokenizer)
result = trainer.train()
log = [{"step": r["step"], "reward": r["reward"]} for r in trainer.state.log_history if "reward" in r]
print("PLAIN_RESULT " + json.dumps({"train_runtime": result.metrics["train_runtime"], "rewards": log}))
'''


def timed(command: list[str], env: dict, cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    return time.perf_counter() - start, done


def ours(work: Path, settings: dict, env: dict) -> dict:
    config = work / "grpo.yaml"
    config.write_text(yaml.safe_dump(settings))
    wall, done = timed([str(BIN / "tuneline"), "train", str(config)], env, work)
    if done.returncode != 0:
        raise SystemExit(f"tuneline train failed:\n{done.stderr[-3000:]}")
    out = Path(settings["output_dir"])
    log = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    rewards = [{"step": r["current_steps"], "reward": r["reward"]} for r in log if "reward" in r]
    runtime = json.loads((out / "all_results.json").read_text())["train_runtime"]
    return {"wall_s": wall, "train_runtime": runtime, "rewards": rewards}


def processed_prompts(settings: dict, env: dict, work: Path) -> str:
    """The dataset folder tuneline's build-dataset step stored (a cache hit after our run)."""
    code = ("import json,sys; from tuneline.config import load_config; from tuneline.data import build_dataset; "
            "print(build_dataset(load_config(sys.argv[1]))['path'])")
    done = subprocess.run([sys.executable, "-c", code, str(work / "grpo.yaml")], env=env, cwd=work,
                          capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def plain(work: Path, settings: dict, dataset: str, env: dict) -> dict:
    rewards_file, functions = zip(*(item.rsplit(":", 1) for item in settings["reward_funcs"]), strict=True)
    cfg = {"model": settings["model_name_or_path"], "dataset": dataset, "rewards_file": rewards_file[0],
           "functions": list(functions), "weights": settings["reward_weights"], "seed": settings["seed"],
           "output_dir": str(work / "plain"), "batch": settings["per_device_train_batch_size"],
           "steps": settings["max_steps"], "lr": settings["learning_rate"], "logging_steps": settings["logging_steps"],
           "num_generations": settings["num_generations"], "max_completion_length": settings["max_completion_length"],
           "temperature": settings["temperature"], "top_p": settings["top_p"], "top_k": settings["top_k"]}
    script = work / "plain_grpo.py"
    script.write_text(PLAIN_SCRIPT)
    wall, done = timed([sys.executable, str(script), json.dumps(cfg)], env, work)
    if done.returncode != 0:
        raise SystemExit(f"plain trl script failed:\n{done.stderr[-3000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("PLAIN_RESULT "))
    return {"wall_s": wall, **json.loads(line.removeprefix("PLAIN_RESULT "))}


def grpo_comparison(work: Path, steps: int, prefect_env: dict | None = None) -> dict:
    """Both runs on the demo settings for `steps` steps; the figures as a dict (bench.py adds them to its report)."""
    from tuneline.demo.tiny_model import TINY_PRESETS, build_tiny_model

    work.mkdir(parents=True, exist_ok=True)
    model = work / "tiny-llama"
    if not (model / "config.json").is_file():
        build_tiny_model(model, **TINY_PRESETS["demo"])
    settings = yaml.safe_load(EXAMPLE.read_text())
    settings.update(model_name_or_path=str(model), dataset_dir=str(REPO / "data"), max_steps=steps,
                    logging_steps=1, save_steps=steps, output_dir=str(work / "ours"),
                    pipeline_cache_dir=str(work / "cache"), mlflow_tracking_uri=f"sqlite:///{work}/mlflow.db")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **(prefect_env or {})}
    settings["reward_funcs"] = [str(REPO / item) for item in settings["reward_funcs"]]
    tuned = ours(work, settings, env)
    dataset = processed_prompts(settings, env, work)
    trl_run = plain(work, settings, dataset, env)
    theirs = {r["step"]: r["reward"] for r in trl_run["rewards"]}
    curve = [(r["step"], r["reward"], theirs.get(r["step"])) for r in tuned["rewards"]]
    gaps = [abs(a - b) for _, a, b in curve if b is not None]
    return {"steps": steps, "ours_wall_s": tuned["wall_s"], "plain_wall_s": trl_run["wall_s"],
            "ours_train_s": tuned["train_runtime"], "plain_train_s": trl_run["train_runtime"],
            "extra_wall_s": tuned["wall_s"] - trl_run["wall_s"], "max_reward_gap": max(gaps) if gaps else None,
            "curve": curve}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tuneline-grpo-bench-"))
    result = grpo_comparison(work, args.steps)
    print("step  reward (tuneline)  reward (plain trl)")
    for step, ours_reward, theirs in result["curve"]:
        print(f"{step:>4}  {ours_reward:>17.4f}  {theirs if theirs is None else format(theirs, '>18.4f')}")
    print(f"wall: tuneline {result['ours_wall_s']:.1f} s (train {result['ours_train_s']:.1f} s), plain trl "
          f"{result['plain_wall_s']:.1f} s (train {result['plain_train_s']:.1f} s); tuneline's extra wall "
          f"{result['extra_wall_s']:.1f} s; largest per-step reward gap {result['max_reward_gap']}")
    (work / "grpo_vs_trl.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
