"""pt / sft / rm trainers on the tiny model: loss over label tokens only, loss falling, metrics, predictions."""

from __future__ import annotations

import json
import math

import pytest

from tests.support.training import IGNORE, build, logged, make_config, make_splits


def run(config, stage, tokenizer, splits=None):
    from tuneline.train.trainer_base import train_and_evaluate

    trainer, spec = build(config, stage, tokenizer, splits)
    return trainer, train_and_evaluate(trainer, config, spec, tokenizer)


def test_sft_loss_counts_only_label_tokens(tiny_model_dir, tokenizer, tmp_path):
    import torch

    config = make_config(tiny_model_dir, tmp_path / "out", max_steps=1)
    trainer, _ = build(config, "sft", tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    assert (batch["labels"] == IGNORE).any() and (batch["labels"] != IGNORE).any()
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, dict(batch)).item()
        logits = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    shift_logits, shift_labels = logits[:, :-1].reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1)
    counted = shift_labels != IGNORE
    by_hand = torch.nn.functional.cross_entropy(shift_logits[counted], shift_labels[counted]).item()
    assert loss == pytest.approx(by_hand, rel=1e-5)
    every_token = torch.nn.functional.cross_entropy(shift_logits, batch["input_ids"][:, 1:].reshape(-1)).item()
    assert abs(every_token - by_hand) > 1e-3  # the masked prompt tokens would have changed the loss


@pytest.mark.parametrize("finetuning_type", ["lora", "full"])
def test_sft_training_projects_only_label_positions_with_the_same_loss_and_gradients(tiny_model_dir, tokenizer,
                                                                                   tmp_path, finetuning_type):
    import torch

    config = make_config(tiny_model_dir, tmp_path / "out", max_steps=1, finetuning_type=finetuning_type)
    trainer, _ = build(config, "sft", tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    projected = []
    hook = trainer.model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: projected.append(args[0].shape[:-1].numel()))
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]

    def loss_and_grads(compute):
        trainer.model.zero_grad()
        loss = compute()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in trainable]

    items = (batch["labels"][:, 1:] != IGNORE).sum()
    try:
        fast = loss_and_grads(lambda: trainer.compute_loss(trainer.model, dict(batch), num_items_in_batch=items))
        full = loss_and_grads(lambda: trainer.model(**batch, num_items_in_batch=items).loss)
    finally:
        hook.remove()
    assert projected == [items, batch["input_ids"].numel()]  # label positions only, then every position
    assert torch.allclose(fast[0], full[0], rtol=1e-5)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(fast[1], full[1], strict=True))


def test_sft_full_trains_and_reports_accuracy_and_predictions(tiny_model_dir, tokenizer, tmp_path):
    out = tmp_path / "out"
    config = make_config(tiny_model_dir, out, max_steps=8, compute_accuracy=True, predict_with_generate=True,
                         do_sample=False, max_new_tokens=8, per_device_eval_batch_size=4, do_eval=True)
    trainer, metrics = run(config, "sft", tokenizer)
    losses = logged(out)
    assert len(losses) == 8 and losses[-1] < losses[0]
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0 and metrics["eval_perplexity"] > 1.0
    rows = [json.loads(line) for line in (out / "generated_predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and list(rows[0]) == ["prompt", "predict", "label"]  # LLaMA-Factory's lines
    assert "assistant" in rows[0]["prompt"] and rows[0]["label"]
    assert {"predict_rouge-1", "predict_rouge-2", "predict_rouge-l", "predict_bleu-4"} <= set(metrics)
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    record = json.loads((out / "trainer_log.jsonl").read_text().splitlines()[0])
    assert {"current_steps", "total_steps", "loss", "lr", "epoch", "percentage", "elapsed_time",
            "remaining_time", "total_tokens", "throughput"} <= set(record)
    assert record["total_steps"] == 8 and record["total_tokens"] > 0


def test_sft_lora_trains_only_the_adapter(tiny_model_dir, tokenizer, tmp_path):
    out = tmp_path / "out"
    config = make_config(tiny_model_dir, out, finetuning_type="lora", lora_rank=4, learning_rate=2e-2, max_steps=6)
    trainer, _ = run(config, "sft", tokenizer)
    losses = logged(out)
    assert losses[-1] < losses[0]
    assert (out / "adapter_model.safetensors").is_file() and not (out / "model.safetensors").exists()


def test_pt_trains_on_every_token(tiny_model_dir, tokenizer, tmp_path):
    out = tmp_path / "out"
    splits = make_splits(tokenizer, "sft").map(lambda row: {"labels": row["input_ids"]})
    config = make_config(tiny_model_dir, out, stage="pt", dataset="demo_pt", do_eval=True)
    _, metrics = run(config, "pt", tokenizer, splits)
    losses = logged(out)
    assert losses[-1] < losses[0] and metrics["eval_perplexity"] > 1.0


def test_rm_pairwise_loss_falls_and_reports_accuracy(tiny_model_dir, tokenizer, tmp_path):
    import torch

    from tuneline.train.rm import pair_scores, pairwise_loss

    out = tmp_path / "out"
    config = make_config(tiny_model_dir, out, stage="rm", dataset="demo_pref", max_steps=8, learning_rate=1e-2,
                         do_eval=True)
    trainer, metrics = run(config, "rm", tokenizer)
    losses = logged(out)
    assert losses[-1] < losses[0]
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0 and "eval_margin" in metrics
    # 8 steps of 4 pairs: one epoch; the tokens seen are both answers' of every pair, as logged
    train = trainer.train_dataset
    pair_tokens = sum(sum(mask) for side in ("chosen", "rejected") for mask in train[f"{side}_attention_mask"])
    assert trainer.state.num_input_tokens_seen == pair_tokens
    counts = [entry["num_input_tokens_seen"] for entry in trainer.state.log_history if "num_input_tokens_seen" in entry]
    assert counts[-1] == pair_tokens and counts == sorted(counts)
    batch = trainer.data_collator([trainer.eval_dataset[i] for i in range(4)])
    with torch.no_grad():
        chosen, rejected = pair_scores(trainer.model, batch)
        loss = pairwise_loss(chosen, rejected).item()
    assert loss == pytest.approx(-torch.nn.functional.logsigmoid(chosen - rejected).mean().item(), rel=1e-6)
    # the score is the one at the last real token: extra right padding must not change it
    padded = {k: torch.nn.functional.pad(v, (0, 5), value=0 if "mask" in k else tokenizer.pad_token_id)
              for k, v in batch.items()}
    with torch.no_grad():
        assert torch.allclose(pair_scores(trainer.model, padded)[0], chosen, atol=1e-5)


@pytest.mark.parametrize("finetuning_type", ["lora", "full"])
def test_training_checkpoints_by_default_and_the_loss_is_the_same_without(tiny_model_dir, tokenizer, tmp_path,
                                                                        finetuning_type):
    """LLaMA-Factory's default: the Trainer's steps recompute each layer in the backward pass, unless
    `disable_gradient_checkpointing: true`; the losses do not change either way."""
    from transformers import set_seed

    def train(name, **keys):
        set_seed(7)  # the same LoRA initialisation on both sides
        config = make_config(tiny_model_dir, tmp_path / name, finetuning_type=finetuning_type, max_steps=3, **keys)
        trainer, _ = build(config, "sft", tokenizer)
        mlp = [module for n, module in trainer.model.named_modules() if n.endswith(".mlp")][-1]
        calls = []
        hook = mlp.register_forward_hook(lambda *_: calls.append(1))
        try:
            trainer.train()
        finally:
            hook.remove()
        return len(calls), logged(tmp_path / name)

    on_calls, on_losses = train("on")
    off_calls, off_losses = train("off", disable_gradient_checkpointing=True)
    assert (on_calls, off_calls) == (2 * 3, 3)  # forward plus recompute, per step of one batch
    assert on_losses == pytest.approx(off_losses, rel=1e-6) and len(on_losses) == 3


def test_sft_on_cpu_trains_on_flattened_batches_with_the_padded_batches_losses(tiny_model_dir, tokenizer, tmp_path,
                                                                               monkeypatch):
    """On CPU a training batch goes end to end in one row, so no layer computes a padding position; the losses are
    the padded batches' (eager attention keeps padded batches), and evaluation batches stay padded."""
    import torch
    from transformers import set_seed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU machine, also on a GPU runner

    def train(name, **keys):
        set_seed(7)
        config = make_config(tiny_model_dir, tmp_path / name, max_steps=3, **keys)
        trainer, _ = build(config, "sft", tokenizer)
        batches = (next(iter(trainer.get_train_dataloader())), next(iter(trainer.get_eval_dataloader())))
        set_seed(7)
        trainer.train()
        return batches, logged(tmp_path / name)

    (flat, flat_eval), flat_losses = train("flat")
    (padded, padded_eval), padded_losses = train("padded", attn_implementation="eager")
    assert flat["input_ids"].shape[0] == 1 and "attention_mask" not in flat and padded["input_ids"].shape[0] == 4
    assert flat["input_ids"].numel() == padded["attention_mask"].sum() < padded["attention_mask"].numel()
    assert (flat["labels"] != IGNORE).sum() == (padded["labels"][:, 1:] != IGNORE).sum()
    assert "attention_mask" in flat_eval and flat_eval["input_ids"].shape == padded_eval["input_ids"].shape
    assert flat_losses == pytest.approx(padded_losses, rel=1e-4) and len(flat_losses) == 3


def test_group_by_length_samples_pairs_by_their_longer_side(tiny_model_dir, tokenizer, tmp_path):
    """Pairwise rows have no `input_ids` column, from which transformers would read lengths: the trainer adds them."""
    config = make_config(tiny_model_dir, tmp_path / "out", stage="rm", dataset="demo_pref", group_by_length=True)
    trainer, _ = build(config, "rm", tokenizer)
    rows = trainer.train_dataset
    sides = zip(rows["chosen_input_ids"], rows["rejected_input_ids"], strict=True)
    assert rows["length"] == [max(len(chosen), len(rejected)) for chosen, rejected in sides]
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["chosen_input_ids"].shape[0] == 4 and "length" not in batch


def test_early_stopping_ends_at_the_best_checkpoint(tiny_model_dir, tokenizer, tmp_path):
    """A learning rate that wrecks the model: evaluation stops improving, training stops, the best step is kept."""
    from safetensors.torch import load_file

    from tuneline.train.checkpoints import complete_checkpoints

    out = tmp_path / "out"
    config = make_config(tiny_model_dir, out, max_steps=12, learning_rate=0.3, eval_strategy="steps", eval_steps=1,
                         save_steps=1, early_stopping_steps=2, load_best_model_at_end=True, eval_dataset="demo_sft_eval")
    trainer, _ = run(config, "sft", tokenizer)
    records = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    evals = [(r["current_steps"], r["eval_loss"]) for r in records if "eval_loss" in r]
    assert trainer.state.global_step < 12  # stopped early
    best_step = min(evals[:-1], key=lambda e: e[1])[0]  # the last record is the final evaluation
    best = out / f"checkpoint-{best_step}"
    assert trainer.state.best_model_checkpoint == str(best) and best in complete_checkpoints(out)
    final, kept = load_file(str(out / "model.safetensors")), load_file(str(best / "model.safetensors"))
    assert all(bool((final[k] == kept[k]).all()) for k in kept)
    last = complete_checkpoints(out)[-1]
    assert last != best and any(bool((final[k] != v).any()) for k, v in load_file(str(last / "model.safetensors")).items())


def test_early_stopping_without_evaluations_is_a_config_error(tiny_model_dir, tmp_path):
    from tuneline.errors import ConfigError
    from tuneline.train.training_args import build_training_args

    with pytest.raises(ConfigError, match="early_stopping_steps: 3.*eval_strategy: steps"):
        build_training_args(make_config(tiny_model_dir, tmp_path / "out", early_stopping_steps=3))


def test_neftune_noise_reaches_training_only(tiny_model_dir, tokenizer, tmp_path):
    """neftune_noise_alpha passes through to transformers: noisy embeddings change the first training loss."""
    import torch

    losses, outputs = {}, {}
    for alpha in (None, 5.0):
        out = tmp_path / f"alpha-{alpha}"
        noise = {"neftune_noise_alpha": alpha} if alpha else {}
        config = make_config(tiny_model_dir, out, max_steps=1, learning_rate=1e-9, **noise)
        trainer, _ = run(config, "sft", tokenizer)
        assert trainer.args.neftune_noise_alpha == alpha
        losses[alpha] = logged(out)[0]
        batch = trainer.data_collator([trainer.eval_dataset[i] for i in range(2)])
        trainer.model.train()  # after training the hook is gone: no noise even in train mode
        with torch.no_grad():
            outputs[alpha] = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert abs(losses[5.0] - losses[None]) > 1e-4
    assert torch.allclose(outputs[5.0], outputs[None], atol=1e-4)


@pytest.mark.parametrize(("max_steps", "passes"), [(4, 2), (5, 3)])
def test_the_final_evaluation_reuses_the_loops_evaluation_of_the_same_weights(tiny_model_dir, tokenizer, tmp_path,
                                                                              max_steps, passes):
    """eval_steps 2: with 4 steps the loop scored the final weights at step 4, so no third pass runs and the
    results are that evaluation's; with 5 steps the last one (step 4) is older, and the weights are scored again."""
    from transformers import TrainerCallback

    from tuneline.train.trainer_base import train_and_evaluate

    class CountEvaluations(TrainerCallback):
        def __init__(self):
            self.steps: list[int] = []

        def on_evaluate(self, args, state, control, **kwargs):
            self.steps.append(state.global_step)

    config = make_config(tiny_model_dir, tmp_path / "out", max_steps=max_steps, eval_strategy="steps", eval_steps=2,
                         eval_dataset="demo_sft_eval")
    trainer, spec = build(config, "sft", tokenizer)
    counter = CountEvaluations()
    trainer.add_callback(counter)
    metrics = train_and_evaluate(trainer, config, spec, tokenizer)
    assert counter.steps == [2, 4, 5][:passes]
    last = [e for e in trainer.state.log_history if "eval_loss" in e][-1]
    assert last["step"] == max_steps and metrics["eval_loss"] == last["eval_loss"]
    assert metrics["eval_perplexity"] == pytest.approx(math.exp(last["eval_loss"]))
    saved = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert saved["eval_loss"] == last["eval_loss"] and "eval_runtime" in saved
