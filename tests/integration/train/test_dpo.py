"""dpo stage: precomputed and live references agree; training on demo pairs raises rewards/accuracies."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import pytest

from tests.support.training import (
    grad_enabled_per_forward,
    live_and_stored_metrics,
    nudge,
    preference_config,
    preference_trainer,
    train_split_as_eval,
    trainer_log_entries,
)
from tuneline.data import build_dataset, load_processed
from tuneline.model import load_model, load_tokenizer
from tuneline.reference import build_reference_logps, load_reference_model
from tuneline.train.dpo import DPOTrainer

# the stage, its data and sizes on preference_config's tiny run
STAGE = {"stage": "dpo", "dataset": "demo_pref", "max_samples": 64, "val_size": 16, "logging_steps": 5}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


def make_config(tmp_path, model_dir, cache_dir, **overrides):
    return preference_config(tmp_path, model_dir, cache_dir, **{**STAGE, **overrides})


make_trainer = partial(preference_trainer, DPOTrainer)


@pytest.mark.parametrize(("finetuning_type", "pref_loss"), [("lora", "sigmoid"), ("full", "ipo"),
                                                             ("freeze", "hinge")])
def test_precomputed_and_live_reference_agree(tmp_path, tiny_model_dir, cache_dir, finetuning_type, pref_loss):
    freeze = {"freeze_trainable_layers": 1} if finetuning_type == "freeze" else {}  # refused elsewhere
    config = make_config(tmp_path, tiny_model_dir, cache_dir, finetuning_type=finetuning_type, pref_loss=pref_loss,
                         **freeze)
    data_ref = build_dataset(config)
    ref_ref = build_reference_logps(config, data_ref)
    assert ref_ref["needed"] and ref_ref["rows"] == {"train": 48, "validation": 16}
    tokenizer = load_tokenizer(config.model)
    policy = load_model(config, tokenizer)
    nudge(policy)
    live = make_trainer(config, policy, tokenizer, load_processed(data_ref),
                        load_reference_model(config, tokenizer))
    stored = make_trainer(config, policy, tokenizer, load_processed(ref_ref), None)
    assert (live.ref_model is None) == (finetuning_type == "lora")  # LoRA: the policy with adapter disabled
    for metrics in live_and_stored_metrics(live, stored, policy, "ref_chosen_logps"):
        assert abs(metrics["rewards/margins"]) > 1e-4  # the policy really differs from the reference


def test_reference_step_is_a_cache_hit_across_beta_and_loss(tmp_path, tiny_model_dir, cache_dir):
    first = build_reference_logps(make_config(tmp_path, tiny_model_dir, cache_dir, pref_beta=0.1), build_dataset(
        make_config(tmp_path, tiny_model_dir, cache_dir)))
    data_ref = build_dataset(make_config(tmp_path, tiny_model_dir, cache_dir))
    for overrides in ({"pref_beta": 0.5}, {"pref_loss": "hinge"}, {"learning_rate": 1e-3}):
        again = build_reference_logps(make_config(tmp_path, tiny_model_dir, cache_dir, **overrides), data_ref)
        assert again["cache_hit"] and again["path"] == first["path"], overrides


def test_lora_dpo_raises_reward_accuracy_with_precomputed_reference(tmp_path, tiny_model_dir, cache_dir):
    from tuneline.train.dpo import run

    config = make_config(tmp_path, tiny_model_dir, cache_dir, max_steps=24, learning_rate=5e-3, pref_beta=0.5,
                         lr_scheduler_type="constant", max_samples=40, val_size=8, logging_steps=8,
                         eval_strategy="steps", eval_steps=24, eval_on_start=True)
    ref = build_reference_logps(config, build_dataset(config))
    assert ref["rows"] == {"train": 32, "validation": 8}
    result = run(config, train_split_as_eval(ref, tmp_path / "eval-data"), [])
    log = trainer_log_entries(config.output_dir)
    train_log = [e for e in log if "rewards/accuracies" in e]
    evals = [e for e in log if "eval_rewards/accuracies" in e]
    assert [e["current_steps"] for e in evals] == [0, 24]  # on start and at eval_steps (the final weights: not again)
    before, after = evals[0], evals[-1]
    # Before training the policy is its reference: zero rewards (to float32 noise: the reference's log-probs were
    # summed in other batches, whose padding changes the summation order by an ulp or two), loss log 2.
    assert abs(before["eval_rewards/margins"]) < 1e-4 and abs(before["eval_rewards/chosen"]) < 1e-4
    assert before["eval_loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert after["eval_rewards/accuracies"] >= 0.9, evals
    assert after["eval_loss"] < 0.4 and after["eval_rewards/margins"] > 1.0, evals
    assert after["eval_rewards/chosen"] > after["eval_rewards/rejected"]
    accuracies = [e["rewards/accuracies"] for e in train_log]
    assert len(accuracies) == 3 and accuracies[-1] >= accuracies[0] + 0.3, accuracies
    assert train_log[-1]["loss"] < train_log[0]["loss"] - 0.3
    for name in ("rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected"):
        assert name in train_log[0] and f"eval_{name}" in before
    assert result["metrics"]["eval_rewards/accuracies"] == after["eval_rewards/accuracies"]


@pytest.mark.parametrize("pref_loss", ["orpo", "simpo"])
def test_reference_free_losses_train_without_reference(tmp_path, tiny_model_dir, cache_dir, pref_loss):
    from tuneline.train.dpo import run

    config = make_config(tmp_path, tiny_model_dir, cache_dir, pref_loss=pref_loss, max_steps=10,
                         learning_rate=5e-3, finetuning_type="full")
    ref = build_reference_logps(config, build_dataset(config))
    assert ref["needed"] is False
    run(config, build_dataset(config), [])
    log = trainer_log_entries(config.output_dir)
    assert all(e["loss"] > 0 for e in log if "loss" in e)
    if pref_loss == "orpo":
        assert "sft_loss" in log[0] and "odds_ratio_loss" in log[0]


@pytest.mark.parametrize("finetuning_type", ["lora", "full"])
def test_a_live_reference_runs_before_the_policy(tmp_path, tiny_model_dir, cache_dir, finetuning_type):
    """The forwards without gradients come first, so their logits are freed before the policy keeps its
    activations for backward: a live reference adds its weights to the peak memory, not its activations."""
    config = make_config(tmp_path, tiny_model_dir, cache_dir, finetuning_type=finetuning_type)
    seen = grad_enabled_per_forward(config, DPOTrainer)
    assert seen[-1] is True and False in seen and seen == sorted(seen), seen
