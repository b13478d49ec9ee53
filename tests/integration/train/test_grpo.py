"""grpo stage on trl's GRPOTrainer: the prompts the data step renders, the refusals before anything trains, a short
run scored by each kind of reward (a trl built-in, a user's file:function, a reward model folder), the evaluate
step's paired scoring, a sweep over a grpo key, and a killed run resuming to the uninterrupted run's weights."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.training import REPO_ROOT, config_values, make_config, write_config
from tuneline.errors import ConfigError

REWARDS_PY = '''
import json, os

def mentions_solution(completions, solution, **kwargs):
    with open(os.environ["GRPO_TEST_SEEN"], "a") as out:  # what trl handed over, for the test to read
        out.write(json.dumps({"solution": solution, "n": len(completions)}) + "\\n")
    return [float(bool(s) and s in c) for c, s in zip(completions, solution)]

def letter_share(completions, **kwargs):
    return [sum(ch.isalpha() for ch in c) / max(len(c), 1) for c in completions]

def no_kwargs(completions):
    return [0.0 for _ in completions]
'''
GRPO = {"stage": "grpo", "finetuning_type": "lora", "lora_rank": 4, "template": "chatml", "cutoff_len": 256,
        "max_samples": 32, "num_generations": 4, "max_completion_length": 4, "per_device_train_batch_size": 4,
        "max_steps": 2, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "learning_rate": 1e-2}


@pytest.fixture(scope="module")
def rewards_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rewards") / "rewards.py"
    path.write_text(REWARDS_PY)
    return path


@pytest.fixture(scope="module")
def reward_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """What `stage: rm` with full tuning saves: a one-label sequence classifier beside its tokenizer."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = tmp_path_factory.mktemp("rm") / "length_rm"
    AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    return folder


def grpo_config(model_dir, output_dir, **overrides):
    return make_config(model_dir, output_dir, **{**GRPO, **overrides})


def test_prompts_are_the_template_rendering_and_the_last_answer_is_the_solution(tiny_model_dir, tmp_path,
                                                                               rewards_file):
    from transformers import AutoTokenizer

    from tuneline.data import build_dataset, load_processed

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = json.loads((REPO_ROOT / "data" / "demo_sft.json").read_text())
    for dataset in ("demo_sft", "demo_sharegpt"):
        config = grpo_config(tiny_model_dir, tmp_path / dataset, dataset=dataset,
                             reward_funcs=[f"{rewards_file}:letter_share"])
        train = load_processed(build_dataset(config))["train"]
        assert {"prompt", "solution"} <= set(train.column_names)
        for row in train.select(range(4)):
            # trl tokenizes the text without adding special tokens: it must give back the template's own ids
            assert tokenizer(row["prompt"], add_special_tokens=False)["input_ids"] == row["input_ids"]
            assert row["prompt"].endswith("<|im_start|>assistant\n") and row["solution"]
    first = load_processed(build_dataset(grpo_config(tiny_model_dir, tmp_path / "a", dataset="demo_sft",
                                                     reward_funcs=["think_format"])))["train"]
    by_prompt = {f"{r['instruction']}\n{r['input']}": r["output"] for r in rows}
    for row in first.select(range(8)):
        user = row["prompt"].split("<|im_start|>user\n")[-1].split("<|im_end|>")[0]  # the last user turn
        assert by_prompt[user] == row["solution"]


def test_every_reward_and_grpo_key_problem_is_refused_before_training_at_once(tiny_model_dir, tmp_path,
                                                                             rewards_file):
    from tuneline.pipeline.preflight import checked_config

    bad = {**config_values(tiny_model_dir, tmp_path / "out", **GRPO), "use_vllm": True,
           "reward_funcs": ["think_formt", f"{rewards_file}:nope", f"{rewards_file}:no_kwargs",
                            str(tmp_path / "missing.py") + ":f", str(tmp_path), "accuracy"],
           "reward_weights": [1.0, 2.0], "num_generations": 1}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError) as caught:
        checked_config(str(path))
    message = str(caught.value)
    for expected in ("'think_formt' is not a built-in reward; did you mean 'think_format'?",
                     f"'{rewards_file}' defines no function 'nope'",
                     "no_kwargs(prompts=..., completions=..., solution=..., **kwargs) and it cannot take that",
                     "missing.py' does not exist", "is a folder without a model",
                     "'use_vllm: true' generates with vLLM, which needs a CUDA GPU",
                     "'reward_weights' has 2 weights for 6 rewards", "'num_generations: 1' must be at least 2"):
        assert expected in message
    if importlib.util.find_spec("math_verify") is None:  # not installed here: the accuracy rewards need it
        assert "'accuracy' needs the math-verify package: pip install 'tuneline[math]'" in message
    sft = {**config_values(tiny_model_dir, tmp_path / "sft"), "beta": 0.04}
    with pytest.raises(ConfigError, match="'beta: 0.04' has no effect in this run: it applies only with 'stage: "
                                          "grpo'"):
        checked_config(None, sft)
    # the command a user runs: exit 2, one message, no traceback
    done = subprocess.run([sys.executable, "-m", "cli.main", "validate", str(path)], capture_output=True,
                          text=True, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 2 and "Traceback" not in done.stderr and "think_formt" in done.stderr


def test_one_run_scored_by_a_builtin_a_file_function_and_a_reward_model(tiny_model_dir, tmp_path, rewards_file,
                                                                        reward_model_dir, monkeypatch):
    from safetensors.torch import load_file

    from tuneline.data import build_dataset
    from tuneline.train import stage_runner

    seen = tmp_path / "seen.jsonl"
    monkeypatch.setenv("GRPO_TEST_SEEN", str(seen))
    config = grpo_config(tiny_model_dir, tmp_path / "out", dataset="demo_sft", beta=0.04, save_steps=1000,
                         reward_funcs=["think_format", f"{rewards_file}:mentions_solution", str(reward_model_dir)],
                         reward_weights=[1.0, 2.0, 0.5])
    result = stage_runner("grpo")(config, build_dataset(config), [])
    assert result["global_step"] == 2
    logs = [json.loads(line) for line in (tmp_path / "out" / "trainer_log.jsonl").read_text().splitlines()]
    steps = [r for r in logs if "reward" in r]
    assert len(steps) == 2 and all("kl" in r for r in steps), "beta > 0: trl measures the KL to the reference"
    for name in ("think_format", "mentions_solution", "length_rm"):
        assert all(f"rewards/{name}/mean" in r for r in steps)
    rm_means = [r["rewards/length_rm/mean"] for r in steps]
    assert all(value != 0.0 for value in rm_means), "the reward model scored the answers"
    calls = [json.loads(line) for line in seen.read_text().splitlines()]
    solutions = {r["output"] for r in json.loads((REPO_ROOT / "data" / "demo_sft.json").read_text())}
    assert calls and all(c["n"] == 4 and set(c["solution"]) <= solutions for c in calls)
    adapter = load_file(str(tmp_path / "out" / "adapter_model.safetensors"))
    assert any(name.endswith("lora_B.weight") and value.abs().sum() > 0 for name, value in adapter.items()), \
        "LoRA B starts at zero: a trained adapter has moved it"


def test_the_evaluate_step_scores_seeded_samples_with_the_run_rewards(tiny_model_dir, tmp_path, rewards_file,
                                                                      reward_model_dir):
    from tuneline.data import build_dataset
    from tuneline.evaluation.run import run_evaluation
    from tuneline.evaluation.sampled_rewards import reward_means

    means = reward_means([lambda completions, **_: [1.0, None, 3.0], lambda completions, **_: [0.0, 1.0, 1.0]],
                         ["a", "b"], [2.0, 0.5], ["p"] * 3, ["x"] * 3, [[1]] * 3, ["s"] * 3)
    assert means == pytest.approx({"reward_a": 2.0, "reward_b": 2 / 3, "reward": 2.0 * 2.0 + 0.5 * 2 / 3})
    config = grpo_config(tiny_model_dir, tmp_path / "out", dataset="demo_sft", val_size=8, eval_max_samples=6,
                         reward_funcs=[f"{rewards_file}:letter_share", str(reward_model_dir)], reward_weights=[1, 2])
    ref = build_dataset(config)
    first, again = run_evaluation(config, ref, None), run_evaluation(config, ref, None)
    assert set(first["metrics"]) == {"reward", "reward_letter_share", "reward_length_rm"}
    assert first["metrics"] == again["metrics"], "the same seed samples the same answers"
    assert first["metrics"]["reward"] == pytest.approx(first["metrics"]["reward_letter_share"]
                                                       + 2 * first["metrics"]["reward_length_rm"])
    assert len(first["predictions"]) == 6 and all(p["label"] for p in first["predictions"])


def test_a_sweep_over_a_grpo_key_plans_valid_points(tiny_model_dir, tmp_path, rewards_file):
    from tuneline.pipeline.sweep_grid import plan_sweep

    path = write_config(tmp_path / "grpo.yaml", tiny_model_dir, tmp_path / "out",
                        **{**GRPO, "dataset": "demo_sft", "val_size": 8,
                           "reward_funcs": [f"{rewards_file}:letter_share"]})
    points = plan_sweep(str(path), {"beta": "0.0,0.04", "num_generations": "2,4"}, metric="reward")
    assert len(points) == 4
    for point in points:
        assert point.config.stage == "grpo" and point.config.grpo.beta == point.values["beta"]
        assert point.config.grpo.num_generations == point.values["num_generations"]
    with pytest.raises(ConfigError, match="'num_generations: 1' must be at least 2"):
        plan_sweep(str(path), {"num_generations": "1,4"}, metric="reward")


RESUME = {**GRPO, "dataset": "demo_sft", "max_steps": 12, "save_steps": 2, "logging_steps": 1,
          "lr_scheduler_type": "linear", "learning_rate": 5e-3}


def train_cmd(config_path) -> list[str]:
    return [sys.executable, "-m", "tuneline.train", str(config_path)]


def step_logs(output_dir: Path) -> dict[int, dict]:
    lines = [json.loads(line) for line in (output_dir / "trainer_log.jsonl").read_text().splitlines()]
    return {r["current_steps"]: r for r in lines if "reward" in r}


def test_a_killed_grpo_run_resumes_to_the_uninterrupted_runs_weights(tiny_model_dir, tmp_path, rewards_file):
    from safetensors.torch import load_file

    from tuneline.runtime.contract import read_run_file
    from tuneline.train.checkpoints import checkpoint_step, complete_checkpoints

    settings = {**RESUME, "reward_funcs": [f"{rewards_file}:letter_share"],
                "pipeline_cache_dir": str(tmp_path / "cache")}
    reference = write_config(tmp_path / "reference.yaml", tiny_model_dir, tmp_path / "reference", **settings)
    killed_dir = tmp_path / "killed"
    killed = write_config(tmp_path / "killed.yaml", tiny_model_dir, killed_dir, **settings)
    done = subprocess.run(train_cmd(reference), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    victim = subprocess.Popen(train_cmd(killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while victim.poll() is None and not complete_checkpoints(killed_dir):
        time.sleep(0.2)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    killed_at = checkpoint_step(complete_checkpoints(killed_dir)[-1])
    assert killed_at < 12 and read_run_file(killed_dir)["status"] == "running", "killed too late to test resume"
    resumed = subprocess.run(train_cmd(killed), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert read_run_file(killed_dir)["status"] == "complete"
    expected, got = step_logs(tmp_path / "reference"), step_logs(killed_dir)
    for step in range(killed_at + 1, 13):
        assert got[step]["reward"] == pytest.approx(expected[step]["reward"]), f"step {step}"
    want = load_file(str(tmp_path / "reference" / "adapter_model.safetensors"))
    have = load_file(str(killed_dir / "adapter_model.safetensors"))
    for name, value in want.items():
        assert (have[name] - value).abs().max().item() < 1e-5, name


def test_rloo_trains_the_same_run_on_trls_rloo_trainer(tiny_model_dir, tmp_path, rewards_file):
    from tuneline.data import build_dataset
    from tuneline.train import stage_runner

    with pytest.raises(ConfigError, match="'loss_type: grpo' has no effect under 'stage: rloo'"):
        grpo_config(tiny_model_dir, tmp_path / "bad", stage="rloo", dataset="demo_sft", loss_type="grpo",
                    reward_funcs=["think_format"])
    config = grpo_config(tiny_model_dir, tmp_path / "out", stage="rloo", dataset="demo_sft", beta=0.05,
                         reward_funcs=[f"{rewards_file}:letter_share"])
    result = stage_runner("rloo")(config, build_dataset(config), [])
    assert result["global_step"] == 2
    logs = [json.loads(line) for line in (tmp_path / "out" / "trainer_log.jsonl").read_text().splitlines()]
    assert [r["current_steps"] for r in logs if "rewards/letter_share/mean" in r] == [1, 2]
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()
