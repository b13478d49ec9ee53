"""ppo stage: PPO's arithmetic against hand computations, the reward model's loading and its config errors, the
direction of one PPO update, a short run that logs, checkpoints, resumes and saves, and the demo raising the
reward."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from tests.support.ppo import make_config, ppo_config
from tuneline.config import load_config
from tuneline.errors import ConfigError, UserError
from tuneline.objectives.rollouts import response_mask
from tuneline.train import ppo_core

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "data"


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_gae_by_hand_and_zero_outside_the_answer():
    # Row: one prompt position (mask 0), then three answer tokens; score 1 on the last one.
    rewards, values, mask = t([[0.0, 0.0, 0.0, 1.0]]), t([[9.0, 0.5, 0.2, 0.1]]), t([[0, 1, 1, 1]])
    advantages, returns = ppo_core.gae(rewards, values, mask, gamma=1.0, lam=0.95)
    a3 = 1.0 - 0.1                     # delta at the last token: r + 0 - v
    a2 = (0.0 + 0.1 - 0.2) + 0.95 * a3
    a1 = (0.0 + 0.2 - 0.5) + 0.95 * a2
    assert advantages[0].tolist() == pytest.approx([0.0, a1, a2, a3])
    assert returns[0].tolist() == pytest.approx([0.0, a1 + 0.5, a2 + 0.2, a3 + 0.1])


def test_token_rewards_put_the_score_on_the_last_answer_token():
    logps, ref_logps = t([[-1.0, -2.0, -1.0, -3.0]]), t([[-1.0, -2.5, -1.5, -3.0]])
    mask = t([[0, 1, 1, 0]])  # answer at positions 1-2, padding after
    rewards, kl = ppo_core.token_rewards(t([2.0]), logps, ref_logps, mask, kl_coef=0.1)
    assert kl[0].tolist() == pytest.approx([0.0, 0.5, 0.5, 0.0])
    assert rewards[0].tolist() == pytest.approx([0.0, -0.05, 2.0 - 0.05, 0.0])


def test_clipped_policy_loss():
    old, new = t([[0.0, 0.0]]), t([[0.5, 0.5]])  # ratio e^0.5 = 1.6487 on both tokens
    mask = t([[1, 1]])
    loss, clipfrac = ppo_core.policy_loss(new, old, t([[1.0, -1.0]]), mask, clip=0.2)
    ratio = math.exp(0.5)
    # A = +1: max(-r, -1.2) = -1.2 (clipped); A = -1: max(r, 1.2) = r (not clipped)
    assert loss.item() == pytest.approx((-1.2 + ratio) / 2)
    assert clipfrac.item() == pytest.approx(0.5)


def test_clipped_value_loss():
    values, old, returns, mask = t([[1.0, 0.0]]), t([[0.0, 0.0]]), t([[2.0, 1.0]]), t([[1, 1]])
    loss = ppo_core.value_loss(values, old, returns, mask, clip=0.2)
    # token 0: max((1-2)^2, (0.2-2)^2) = 3.24 ; token 1: max(1, 1) = 1
    assert loss.item() == pytest.approx(0.5 * (3.24 + 1.0) / 2)


def test_adaptive_kl_moves_towards_the_target():
    high = ppo_core.AdaptiveKL(coef=0.2, target=6.0, horizon=10000)
    assert high.update(kl=12.0, n_steps=8) == pytest.approx(0.2 * (1 + 0.2 * 8 / 10000))  # error clipped to 0.2
    low = ppo_core.AdaptiveKL(coef=0.2, target=6.0, horizon=10000)
    assert low.update(kl=5.4, n_steps=10) == pytest.approx(0.2 * (1 - 0.1 * 10 / 10000))
    fixed = ppo_core.AdaptiveKL(coef=0.2, target=None)
    assert fixed.update(kl=100.0, n_steps=8) == 0.2


def test_response_mask_stops_after_the_first_eos():
    mask = response_mask(torch.tensor([[5, 3, 7, 3], [5, 6, 7, 8]]), eos_token_id=3)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]


def test_masked_whiten():
    values, mask = t([[1.0, 3.0, 100.0]]), t([[1, 1, 0]])
    out = ppo_core.masked_whiten(values, mask)
    assert out[0].tolist() == pytest.approx([-1.0, 1.0, 0.0], abs=1e-6)


def test_reward_model_loads_as_the_rm_stage_trained_it(tiny_model_dir, reward_model_dir, tmp_path):
    from tuneline.data import build_collator, build_dataset, load_processed
    from tuneline.model import load_model, load_tokenizer
    from tuneline.objectives.rewards import load_reward_model
    from tuneline.train.rm import pair_scores

    config = ppo_config(tiny_model_dir, reward_model_dir, tmp_path)
    tokenizer = load_tokenizer(config.model)
    reward = load_reward_model(config, tokenizer)
    rm_config = make_config(tiny_model_dir, tmp_path / "x", tmp_path / "cache", stage="rm", dataset="demo_pref",
                            max_samples=16, adapter_name_or_path=str(reward_model_dir))
    unmerged = load_model(rm_config, tokenizer, is_trainable=False, add_valuehead=True)
    pairs = load_processed(build_dataset(rm_config))["train"]
    batch = build_collator("rm", tokenizer)([pairs[i] for i in range(8)])
    with torch.no_grad():
        ours, theirs = pair_scores(reward, batch), pair_scores(unmerged, batch)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert ours[0].std() > 1e-4  # a trained score head, not a constant


def test_reward_model_config_errors(tiny_model_dir, reward_model_dir, tmp_path):
    from tuneline.demo.tiny_model import build_tiny_model
    from tuneline.model import load_tokenizer
    from tuneline.objectives.rewards import load_reward_model

    config = ppo_config(tiny_model_dir, reward_model_dir, tmp_path, reward_model_type="full")
    tokenizer = load_tokenizer(config.model)
    with pytest.raises(ConfigError, match="is a LoRA adapter but 'reward_model_type' is 'full'"):
        load_reward_model(config, tokenizer)
    other = build_tiny_model(tmp_path / "other", vocab_size=300)
    config = ppo_config(tiny_model_dir, other, tmp_path, reward_model_type="full")
    with pytest.raises(ConfigError, match="tokenizer that does not match"):
        load_reward_model(config, tokenizer)


def test_ppo_runs_logs_and_saves(tiny_model_dir, reward_model_dir, tmp_path):
    from tuneline.data import build_dataset
    from tuneline.train.ppo import run

    config = ppo_config(tiny_model_dir, reward_model_dir, tmp_path, save_strategy="steps", save_steps=2)
    result = run(config, build_dataset(config), [])
    out = Path(result["output_dir"])
    log = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    train = [e for e in log if "reward" in e]
    evals = [e for e in log if "eval_reward" in e]
    assert [e["current_steps"] for e in train] == [1, 2, 3] and result["global_step"] == 3
    assert [e["current_steps"] for e in evals] == [0, 3]  # the reward before and after training
    for name in ("reward", "kl", "kl_coef", "policy_loss", "value_loss", "loss", "lr"):
        assert all(math.isfinite(e[name]) for e in train), name
    assert abs(train[0]["kl"]) < 1e-5  # the first rollout comes from the untouched policy == reference
    assert train[-1]["kl"] != 0.0  # later ones from a policy that moved
    assert (out / "adapter_model.safetensors").is_file() and (out / "value_head.pt").is_file()
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()
    assert not (out / "checkpoint-2" / "model.safetensors").exists()  # the adapter, not accelerate's whole model
    assert result["metrics"]["eval_reward"] == evals[-1]["eval_reward"]
    # Resumed from checkpoint-2: one step more, and the log keeps each step once.
    config.training["resume_from_checkpoint"] = str(out / "checkpoint-2")
    again = run(config, build_dataset(config), [])
    assert again["global_step"] == 3
    log = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    assert [e["current_steps"] for e in log if "reward" in e] == [1, 2, 3]
    # A checkpoint without this process's random state (more processes now, or an earlier tuneline's) is refused.
    (out / "checkpoint-2" / "random_states_0.pkl").unlink()
    with pytest.raises(UserError, match="holds no random state for process 0"):
        run(config, build_dataset(config), [])


@pytest.mark.parametrize(("tuning", "weights"), [({"lora_dropout": 0.1}, "adapter_model.safetensors"),
                                                 ({"finetuning_type": "full"}, "model.safetensors")],
                         ids=["lora", "full"])
def test_ppo_resumed_from_a_checkpoint_ends_as_the_uninterrupted_run(tiny_model_dir, reward_model_dir, tmp_path,
                                                                     tuning, weights):
    """Same weights, value head and logged metrics after checkpoint 2 whether the run stopped there or not, for
    LoRA (the checkpoint holds the adapter) and full tuning (the whole model).

    Dropout, sampling, the mini-batch order, the KL coefficient and a logging window that spans the checkpoint all
    draw on state the checkpoint must carry. Accumulation: rollouts of 2 x 2 answers, one optimizer step per rollout
    pass.
    """
    from safetensors.torch import load_file

    from tuneline.data import build_dataset
    from tuneline.train.ppo import run

    def train(name, **extra):
        config = ppo_config(tiny_model_dir, reward_model_dir, tmp_path / name, max_steps=4, save_strategy="steps",
                            save_steps=2, logging_steps=3, per_device_train_batch_size=2,
                            gradient_accumulation_steps=2, ppo_epochs=2, **tuning, **extra)
        run(config, build_dataset(config), [])
        out = tmp_path / name / "ppo"
        log = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
        return out, {e["current_steps"]: e for e in log if "reward" in e}

    whole, whole_log = train("whole")
    resumed, resumed_log = train("resumed", resume_from_checkpoint=str(whole / "checkpoint-2"))
    assert sorted(whole_log) == [3, 4] and sorted(resumed_log) == [3, 4]
    for step in (3, 4):
        for name in ("reward", "kl", "kl_coef", "loss", "policy_loss", "value_loss"):
            assert resumed_log[step][name] == pytest.approx(whole_log[step][name], abs=1e-6), (step, name)
    a, b = load_file(str(whole / weights)), load_file(str(resumed / weights))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    heads = [torch.load(out / "value_head.pt") for out in (whole, resumed)]
    assert all(torch.allclose(heads[0][k], heads[1][k], atol=1e-6) for k in heads[0])
    state = torch.load(whole / "checkpoint-4" / "optimizer.bin", weights_only=False)
    assert {int(s["step"]) for s in state["state"].values()} == {4 * 2}  # steps x ppo_epochs


@pytest.mark.parametrize(("keys", "message"), [
    ({"finetuning_type": "full", "use_badam": True}, "'use_badam: true' is not supported by 'stage: ppo'"),
    ({"neftune_noise_alpha": 5}, "'neftune_noise_alpha: 5.0' has no effect under 'stage: ppo': NEFTune's"),
    ({"save_strategy": "best"}, "'save_strategy: best' has no effect under 'stage: ppo'"),
    ({"optim": "galore_adamw"}, "'optim: galore_adamw' is driven by transformers' Trainer"),
    ({"optim": "schedule_free_adamw"}, "'optim: schedule_free_adamw' is driven by transformers' Trainer"),
    ({"torch_compile": True}, "'torch_compile: True' has no effect under 'stage: ppo'"),
    ({"eval_strategy": "steps"}, "'eval_strategy: steps' has no effect under 'stage: ppo': the loop measures"),
    ({"do_train": False}, r"'do_train: False' has no effect under 'stage: ppo'.*only True is accepted"),
    ({"pissa_init": True}, "'pissa_init' with 'stage: ppo' and no 'ref_model'"),
])
def test_keys_the_ppo_loop_would_ignore_are_refused(tiny_model_dir, tmp_path, keys, message):
    with pytest.raises(ConfigError, match=message):
        make_config(tiny_model_dir, tmp_path / "ppo", tmp_path / "cache", stage="ppo", dataset="demo_sft",
                    reward_model=str(tiny_model_dir), **keys)


def test_a_llamafactory_ppo_config_is_accepted(tiny_model_dir, tmp_path):
    """The keys LLaMA-Factory's PPO example carries besides those the loop reads: accepted at what the loop does."""
    config = make_config(tiny_model_dir, tmp_path / "ppo", tmp_path / "cache", stage="ppo", dataset="demo_sft",
                         reward_model=str(tiny_model_dir), do_train=True, overwrite_output_dir=True, plot_loss=True,
                         dataloader_num_workers=4, save_only_model=False, report_to="none", warmup_ratio=0.1,
                         ddp_timeout=180000000, save_strategy="steps", save_steps=500, num_train_epochs=3.0,
                         lr_scheduler_type="cosine")
    assert config.stage == "ppo"


class TrainedPolicy(TrainerCallback):
    """The policy's logits on fixed prompts when training ends, and the optimizer's learning rates then."""

    def __init__(self, ids):
        self.ids, self.logits = ids, None

    def on_train_end(self, args, state, control, model=None, **kwargs):
        model.eval()
        with torch.no_grad():
            self.logits = model(input_ids=self.ids, attention_mask=torch.ones_like(self.ids)).logits


def test_ppo_honours_optim_loraplus_epoch_saves_workers_and_pissa(tiny_model_dir, reward_model_dir, tmp_path):
    """`optim: sgd` with LoRA+ learning rates (the value head at `learning_rate`), a checkpoint at the end of each
    epoch of prompts, prompts loaded by a DataLoader worker, and a PiSSA adapter (against its own reference
    model) saved converted: on the original base it reproduces the trained policy. The worker is spawned: a forked
    one would inherit the whole test session's state, and once exited with code 1 at shutdown in a full run."""
    from safetensors.torch import load_file

    from tuneline.data import build_dataset
    from tuneline.model import load_model, load_tokenizer
    from tuneline.train.ppo import run

    config = ppo_config(tiny_model_dir, reward_model_dir, tmp_path, max_samples=16, val_size=8, max_steps=4,
                        optim="sgd", loraplus_lr_ratio=4.0, learning_rate=1e-2, save_strategy="epoch",
                        pissa_init=True, pissa_convert=True, ref_model=str(tiny_model_dir), lora_rank=4,
                        dataloader_num_workers=1, dataloader_multiprocessing_context="spawn")
    ids = torch.randint(4, 300, (2, 10), generator=torch.Generator().manual_seed(0))
    trained = TrainedPolicy(ids)
    run(config, build_dataset(config), [trained])
    out = config.output_dir
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]  # 8 prompts, 4 a step
    state = torch.load(out / "checkpoint-4" / "optimizer.bin", weights_only=False)
    assert sorted({group["lr"] for group in state["param_groups"]}) == [1e-2, 4e-2]  # A and head; B x4
    assert all(not s for s in state["state"].values())  # SGD without momentum keeps no state
    assert load_file(str(out / "adapter_model.safetensors"))  # the converted adapter, rank 2r:
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 8
    tokenizer = load_tokenizer(config.model)
    base = ppo_config(tiny_model_dir, reward_model_dir, tmp_path / "base")
    policy = load_model(base, tokenizer, is_trainable=False, adapters=str(out))
    with torch.no_grad():
        converted = policy(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert torch.allclose(converted, trained.logits, atol=1e-4)


def test_one_ppo_update_moves_log_probs_along_the_advantages(tiny_model_dir, reward_model_dir, tmp_path):
    """The sign and alignment of the whole pipeline: after one optimisation pass on a rollout, answer tokens with
    positive advantage became likelier and those with negative advantage less likely."""
    from tuneline.data import build_collator, build_dataset, load_processed
    from tuneline.model import load_model, load_tokenizer
    from tuneline.objectives.rewards import load_reward_model
    from tuneline.train.ppo import PPOLoop, forward_tokens
    from tuneline.train.ppo_models import ValueHead, load_reference
    from tuneline.train.training_args import build_training_args

    config = ppo_config(tiny_model_dir, reward_model_dir, tmp_path, ppo_epochs=2, learning_rate=1e-3,
                        per_device_train_batch_size=8)
    tokenizer = load_tokenizer(config.model)
    prompts = load_processed(build_dataset(config))["train"]
    policy = load_model(config, tokenizer)
    reference, context = load_reference(config, tokenizer, policy)
    assert reference is policy  # LoRA without ref_model: the policy with its adapter disabled
    loop = PPOLoop(config, build_training_args(config), policy, tokenizer, load_reward_model(config, tokenizer),
                   ValueHead(policy.config.hidden_size), reference, context)
    torch.manual_seed(0)
    roll = loop.rollout(build_collator("ppo", tokenizer)([prompts[i] for i in range(8)]))
    assert roll.kl == pytest.approx(0.0, abs=1e-6) and roll.mask.sum() > 0
    loop.optimise(roll)
    with torch.no_grad():
        new_logps, _ = forward_tokens(policy, roll.ids, roll.attention_mask, config.generating.temperature)
    moved = (new_logps - roll.logps) * roll.mask
    assert (moved * roll.advantages).sum() > 0
    assert moved[roll.advantages > 0].mean() > 0 > moved[roll.advantages < 0].mean()



def test_the_demo_ppo_raises_the_reward_of_the_demo_reward_model(tmp_path):
    """The shipped examples as they are: `rm` trains a reward model, then `ppo` must raise its mean score.

    The score is the mean over the 64 held-out prompts, sampled with the same seed before and after training.
    About a minute: the demo-size model, 300 reward-model steps and 120 PPO steps.
    """
    from tuneline.data import build_dataset
    from tuneline.demo.tiny_model import TINY_PRESETS, build_tiny_model
    from tuneline.train import ppo, rm

    model = build_tiny_model(tmp_path / "tiny", **TINY_PRESETS["demo"])
    paths = {"model_name_or_path": str(model), "dataset_dir": str(DATA), "pipeline_cache_dir": str(tmp_path / "c"),
             "disable_tqdm": True, "report_to": "none"}
    rm_config = load_config(REPO / "examples" / "rm_lora_demo.yaml", {**paths, "output_dir": str(tmp_path / "rm")})
    rm_result = rm.run(rm_config, build_dataset(rm_config), [])
    assert rm_result["metrics"]["eval_accuracy"] > 0.6  # the reward model tells chosen from rejected

    config = load_config(REPO / "examples" / "ppo_lora_demo.yaml",
                         {**paths, "output_dir": str(tmp_path / "ppo"), "reward_model": str(tmp_path / "rm"),
                          "reward_model_config": None})  # the flow's subflow, done here by hand
    dataset = build_dataset(config)
    result = ppo.run(config, dataset, [])
    log = [json.loads(line) for line in (tmp_path / "ppo" / "trainer_log.jsonl").read_text().splitlines()]
    before = next(entry["eval_reward"] for entry in log if "eval_reward" in entry)
    after = result["metrics"]["eval_reward"]
    assert after > before + 0.1, (before, after)
    rewards = [entry["reward"] for entry in log if "reward" in entry]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3  # and the rollouts' reward rose during training

    # The flow's `evaluate` step measures the same thing the same way: base and tuned give the trainer's numbers.
    from tuneline.evaluation.run import run_evaluation

    assert run_evaluation(config, dataset, None)["metrics"]["reward"] == pytest.approx(before, abs=1e-4)
    assert run_evaluation(config, dataset, str(tmp_path / "ppo"))["metrics"]["reward"] == pytest.approx(after, abs=1e-4)


def test_two_cpu_processes_run_ppo_as_one_process_with_the_whole_rollout(tiny_model_dir, reward_model_dir, tmp_path):
    """Data parallel PPO over gloo (2 processes x 2 answers) against 1 process x 4 answers, greedy answers and
    one micro-batch per answer: the same rollouts, so the same normalised scores, whitened advantages, KL and
    averaged gradients, step by step. It fails if any statistic is taken per process, or gradients are not
    averaged. Launched with the training step's own `accelerate launch` command; a checkpoint is written by
    both processes (each its random state)."""
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file

    from tuneline.config import dump_config
    from tuneline.data import build_dataset
    from tuneline.pipeline.launch import launch_command, run_streaming

    shared = {"max_steps": 3, "per_device_train_batch_size": 1, "do_sample": False, "lora_dropout": 0.0,
              "ppo_epochs": 1, "save_strategy": "steps", "save_steps": 2, "max_samples": 24}
    one = ppo_config(tiny_model_dir, reward_model_dir, tmp_path / "one", gradient_accumulation_steps=4, **shared)
    two = ppo_config(tiny_model_dir, reward_model_dir, tmp_path / "two", gradient_accumulation_steps=2,
                     num_processes=2, **shared)
    dataset = build_dataset(one)["path"]
    paths = {name: dump_config(config, tmp_path / f"{name}.yaml") for name, config in (("one", one), ("two", two))}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    single = subprocess.Popen([sys.executable, "-m", "tuneline.train", str(paths["one"]), "--dataset", dataset],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cmd = launch_command(two, paths["two"], dataset)
    assert "--multi_gpu" in cmd and cmd[cmd.index("--num_processes") + 1] == "2"
    run_streaming(cmd, env, lambda line: None)
    assert single.wait() == 0

    def logged(config):
        lines = (Path(config.output_dir) / "trainer_log.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    one_log, two_log = logged(one), logged(two)
    assert [e["current_steps"] for e in two_log if "reward" in e] == [1, 2, 3]  # logged once, not per process
    for a, b in zip(one_log, two_log, strict=True):
        for name in ("reward", "kl", "kl_coef", "policy_loss", "value_loss", "eval_reward"):
            if name in a:
                assert b[name] == pytest.approx(a[name], rel=1e-3, abs=1e-5), (a["current_steps"], name)
    assert len({e["policy_loss"] for e in one_log if "policy_loss" in e}) == 3  # the policy moved between steps
    a = load_file(str(Path(one.output_dir) / "adapter_model.safetensors"))
    b = load_file(str(Path(two.output_dir) / "adapter_model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    checkpoint = Path(two.output_dir) / "checkpoint-2"
    assert {"random_states_0.pkl", "random_states_1.pkl", "optimizer.bin"} <= {p.name for p in checkpoint.iterdir()}

    # Both processes resume from that checkpoint and end as the uninterrupted pair did.
    resumed = ppo_config(tiny_model_dir, reward_model_dir, tmp_path / "resumed", gradient_accumulation_steps=2,
                         num_processes=2, resume_from_checkpoint=str(checkpoint), **shared)
    path = dump_config(resumed, tmp_path / "resumed.yaml")
    run_streaming(launch_command(resumed, path, dataset), env, lambda line: None)
    def step_3(log):
        return next(e for e in log if e.get("current_steps") == 3 and "reward" in e)

    assert step_3(logged(resumed))["policy_loss"] == pytest.approx(step_3(two_log)["policy_loss"], abs=1e-6)
    c = load_file(str(Path(resumed.output_dir) / "adapter_model.safetensors"))
    assert all(torch.allclose(b[k], c[k], atol=1e-6) for k in b)
