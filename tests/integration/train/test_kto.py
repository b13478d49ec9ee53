"""kto stage: precomputed and live references agree, the KL baseline comes from the mismatched pairs, and a few
steps on the demo data raise rewards/accuracies."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import pytest
import torch

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
from tuneline.objectives.logps import completion_logps
from tuneline.reference import build_reference_logps, load_reference_model
from tuneline.train.kto import KTOTrainer

# the stage, its data and sizes on preference_config's tiny run
STAGE = {"stage": "kto", "dataset": "demo_kto", "max_samples": 48, "val_size": 8, "logging_steps": 8}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


def make_config(tmp_path, model_dir, cache_dir, **overrides):
    return preference_config(tmp_path, model_dir, cache_dir, **{**STAGE, **overrides})


make_trainer = partial(preference_trainer, KTOTrainer)


@pytest.mark.parametrize("finetuning_type", ["lora", "full"])
def test_precomputed_and_live_reference_agree(tmp_path, tiny_model_dir, cache_dir, finetuning_type):
    config = make_config(tmp_path, tiny_model_dir, cache_dir, finetuning_type=finetuning_type)
    data_ref = build_dataset(config)
    ref_ref = build_reference_logps(config, data_ref)
    assert ref_ref["needed"] and ref_ref["columns"] == ["ref_logps", "ref_kl_logps"]
    tokenizer = load_tokenizer(config.model)
    policy = load_model(config, tokenizer)
    nudge(policy)
    live = make_trainer(config, policy, tokenizer, load_processed(data_ref),
                        load_reference_model(config, tokenizer))
    stored = make_trainer(config, policy, tokenizer, load_processed(ref_ref), None)
    assert (live.ref_model is None) == (finetuning_type == "lora")
    for metrics in live_and_stored_metrics(live, stored, policy, "ref_kl_logps"):
        assert metrics.keys() >= {"kl", "rewards/accuracies"}


def test_kl_baseline_is_the_mean_log_ratio_of_the_mismatched_pairs(tmp_path, tiny_model_dir, cache_dir):
    config = make_config(tmp_path, tiny_model_dir, cache_dir, pref_beta=0.5)
    ref_ref = build_reference_logps(config, build_dataset(config))
    tokenizer = load_tokenizer(config.model)
    policy = load_model(config, tokenizer)
    trainer = make_trainer(config, policy, tokenizer, load_processed(ref_ref), None)
    features = [trainer.train_dataset[i] for i in range(8)]
    assert any(f["kl_input_ids"] != f["input_ids"] for f in features)  # another row's answer after this prompt
    with torch.no_grad():
        kl_logps = completion_logps(policy, trainer.data_collator(features), "kl_")[0]
    # Stored reference KL log-probs below the policy's by 0.1 * i: z = mean(0.1 * i) = 0.35 for i = 0..7.
    shifted = [{**f, "ref_kl_logps": float(kl_logps[i]) - 0.1 * i} for i, f in enumerate(features)]
    batch = trainer.data_collator(shifted)
    loss, metrics = trainer.batch_loss(policy, batch)
    assert metrics["kl"] == pytest.approx(0.35, abs=1e-5)
    # The policy is its reference on the rows themselves (ratio 0): desirable rows pay 1 - sigmoid(-beta z),
    # undesirable ones 1 - sigmoid(beta z).
    desirable = batch["kto_tags"].bool()
    z, beta = 0.35, 0.5
    expected = torch.where(desirable, 1 - torch.sigmoid(torch.tensor(-beta * z)),
                           1 - torch.sigmoid(torch.tensor(beta * z))).mean()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5)
    assert 0 < desirable.sum() < len(desirable)


def test_lora_kto_raises_reward_accuracy_with_precomputed_reference(tmp_path, tiny_model_dir, cache_dir):
    from tuneline.train.kto import run

    config = make_config(tmp_path, tiny_model_dir, cache_dir, max_steps=24, learning_rate=5e-3, pref_beta=0.5,
                         lr_scheduler_type="constant", max_samples=40, val_size=8, eval_strategy="steps",
                         eval_steps=24, eval_on_start=True)
    ref = build_reference_logps(config, build_dataset(config))
    result = run(config, train_split_as_eval(ref, tmp_path / "eval-data"), [])
    log = trainer_log_entries(config.output_dir)
    train_log = [e for e in log if "rewards/accuracies" in e]
    evals = [e for e in log if "eval_rewards/accuracies" in e]
    assert [e["current_steps"] for e in evals] == [0, 24]  # the loop scored the final weights: not evaluated again
    before, after = evals[0], evals[-1]
    # Policy == reference: every reward 0 (to float32 noise: the reference's log-probs were summed in other batches,
    # whose padding changes the summation order by an ulp or two); loss 1 - sigmoid(0).
    assert abs(before["eval_rewards/chosen"]) < 1e-4 and abs(before["eval_kl"]) < 1e-4
    assert before["eval_loss"] == pytest.approx(0.5, abs=1e-4)
    assert after["eval_rewards/accuracies"] >= 0.85, evals
    assert after["eval_loss"] < 0.4 and after["eval_rewards/margins"] > 1.0, evals
    assert after["eval_rewards/chosen"] > 0 > after["eval_rewards/rejected"]
    accuracies = [e["rewards/accuracies"] for e in train_log]
    assert len(accuracies) == 3 and accuracies[-1] >= accuracies[0] + 0.3, accuracies
    for name in ("rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected", "kl"):
        assert name in train_log[0] and f"eval_{name}" in before
    assert result["metrics"]["eval_rewards/accuracies"] == after["eval_rewards/accuracies"]
    assert not math.isnan(result["metrics"]["eval_loss"])


@pytest.mark.parametrize("finetuning_type", ["lora", "full"])
def test_a_live_reference_runs_before_the_policy(tmp_path, tiny_model_dir, cache_dir, finetuning_type):
    """The forwards without gradients come first, so their logits are freed before the policy keeps its
    activations for backward: a live reference adds its weights to the peak memory, not its activations."""
    config = make_config(tmp_path, tiny_model_dir, cache_dir, finetuning_type=finetuning_type)
    seen = grad_enabled_per_forward(config, KTOTrainer)
    assert seen[-1] is True and False in seen and seen == sorted(seen), seen
