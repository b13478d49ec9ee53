"""Evaluation: cache keys, teacher-forced scores, generation split, text and pairwise metrics, caching.

Real tiny Llama and tokenizer throughout; one module-scoped model is trained a few dozen steps on CPU to
answer every question with "42", so exact match and reward accuracy have a known right answer.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tuneline.config import load_config
from tuneline.content.step_cache import cached_step
from tuneline.errors import UserError
from tuneline.evaluation import evaluate_model, model_content_key, scoring
from tuneline.evaluation.generation import last_labelled_span, split_prompt_answer, text_metrics
from tuneline.evaluation.scoring import IGNORE_INDEX, label_scores, loss_metrics, pairwise_metrics
from tuneline.identity.config_keys import evaluation_key

QUESTIONS = ["What is 2+2?", "Reverse abc", "Name a color", "What is 7*6?", "Say hi", "Count to 3"]
ANSWER, WRONG = "42", "17"


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def model_dir(request, tmp_path_factory) -> Path:
    """helper A's shared tiny model when conftest provides it, else the same builder into a temp folder."""
    try:
        return Path(request.getfixturevalue("tiny_model_dir"))
    except pytest.FixtureLookupError:
        from tuneline.demo.tiny_model import build_tiny_model

        return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def encode_turn(tokenizer, question: str, answer: str) -> tuple[list[int], list[int]]:
    prompt = tokenizer.encode(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")
    reply = tokenizer.encode(answer) + [tokenizer.eos_token_id]
    return prompt + reply, [IGNORE_INDEX] * len(prompt) + reply


def sft_rows(tokenizer, answer: str = ANSWER) -> dict[str, list]:
    rows = [encode_turn(tokenizer, q, answer) for q in QUESTIONS]
    return {"input_ids": [r[0] for r in rows], "attention_mask": [[1] * len(r[0]) for r in rows],
            "labels": [r[1] for r in rows]}


def pair_rows(tokenizer) -> dict[str, list]:
    chosen, rejected = sft_rows(tokenizer, ANSWER), sft_rows(tokenizer, WRONG)
    return {**{f"chosen_{k}": v for k, v in chosen.items()}, **{f"rejected_{k}": v for k, v in rejected.items()}}


def save_splits(folder: Path, columns: dict[str, list], with_validation: bool = True) -> dict:
    """A processed dataset stored as build-dataset stores one (a cached DatasetDict), and its reference."""
    from datasets import Dataset, DatasetDict

    def build(tmp: Path) -> dict:
        splits = {"train": Dataset.from_dict(columns)}
        if with_validation:
            splits["validation"] = Dataset.from_dict(columns)
        DatasetDict(splits).save_to_disk(str(tmp))
        return {"eval_rows": len(splits["validation"]) if with_validation else 0}

    return cached_step(folder, "dataset", f"data-{folder.name}", build)


def make_config(model_dir: Path, cache: Path, **overrides):
    values = {"model_name_or_path": str(model_dir), "stage": "sft", "dataset": "demo_sft",
              "pipeline_cache_dir": str(cache), "output_dir": str(cache / "out"), "eval_max_samples": 4,
              "eval_max_new_tokens": 6, "per_device_eval_batch_size": 4, **overrides}
    return load_config(None, values, check_paths=False)


@pytest.fixture(scope="module")
def trained_dir(model_dir, tokenizer, tmp_path_factory) -> Path:
    """The tiny model after full fine-tuning to answer "42" to anything (a full-model folder, no adapter)."""
    import torch
    from transformers import AutoModelForCausalLM

    from tuneline.evaluation.scoring import pad_rows

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = sft_rows(tokenizer)
    ids, labels = pad_rows(rows["input_ids"], tokenizer.pad_token_id), pad_rows(rows["labels"], IGNORE_INDEX)
    mask = pad_rows(rows["attention_mask"], 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(40):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    out = tmp_path_factory.mktemp("trained") / "model"
    model.save_pretrained(out)
    return out


# ----------------------------------------------------------------------------- keys
def test_eval_key_ignores_training_keys_but_not_eval_keys_model_or_data(model_dir, tmp_path):
    base = make_config(model_dir, tmp_path)
    key = evaluation_key(base, "model-a", "data-1")
    assert evaluation_key(make_config(model_dir, tmp_path, learning_rate=1e-3), "model-a", "data-1") == key
    assert evaluation_key(make_config(model_dir, tmp_path, eval_max_samples=9), "model-a", "data-1") != key
    assert evaluation_key(make_config(model_dir, tmp_path, cutoff_len=64), "model-a", "data-1") != key
    assert evaluation_key(base, "model-b", "data-1") != key
    assert evaluation_key(base, "model-a", "data-2") != key


def test_ppo_eval_key_follows_the_reward_model_content_and_the_sampling(model_dir, tmp_path):
    reward = tmp_path / "rm"
    reward.mkdir()
    (reward / "adapter_config.json").write_text("{}")
    (reward / "adapter_model.safetensors").write_bytes(b"reward-1")
    ppo = {"stage": "ppo", "reward_model": str(reward)}
    key = evaluation_key(make_config(model_dir, tmp_path, **ppo), "model-a", "data-1")
    (reward / "trainer_log.jsonl").write_text("{}\n")
    assert evaluation_key(make_config(model_dir, tmp_path, **ppo), "model-a", "data-1") == key
    assert evaluation_key(make_config(model_dir, tmp_path, **ppo, temperature=0.5), "model-a", "data-1") != key
    (reward / "adapter_model.safetensors").write_bytes(b"reward-2")  # the reward model was trained again
    assert evaluation_key(make_config(model_dir, tmp_path, **ppo), "model-a", "data-1") != key


def test_model_key_follows_weights_not_logs(model_dir, tmp_path):
    config = make_config(model_dir, tmp_path)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"weights-1")
    base_key, tuned_key = model_content_key(config), model_content_key(config, adapter)
    assert base_key != tuned_key
    (adapter / "README.md").write_text("model card written after evaluation")
    (adapter / "trainer_log.jsonl").write_text("{}\n")
    assert model_content_key(config, adapter) == tuned_key
    (adapter / "adapter_model.safetensors").write_bytes(b"weights-2")
    assert model_content_key(config, adapter) != tuned_key
    assert model_content_key(config) == base_key


# ----------------------------------------------------------------------------- pure metrics
def test_last_labelled_span_and_prompt_split():
    eos = {3}
    labels = [IGNORE_INDEX, IGNORE_INDEX, 7, 8, 3, IGNORE_INDEX, IGNORE_INDEX, 9, 10, 3, IGNORE_INDEX]
    ids = [1, 2, 7, 8, 3, 4, 5, 9, 10, 3, 0]
    assert last_labelled_span(labels) == (7, 10)
    assert split_prompt_answer(ids, labels, eos) == ([1, 2, 7, 8, 3, 4, 5], [9, 10])
    assert last_labelled_span([IGNORE_INDEX] * 3) is None
    assert split_prompt_answer([5, 6], [5, 6], eos) is None  # all labelled: no prompt to ask with


def test_pairwise_metrics_by_hand():
    metrics = pairwise_metrics([1.0, 2.0, 3.0, -1.0], [0.0, 2.0, 4.0, -2.0])
    assert metrics["reward_accuracy"] == 0.5  # the tie (2 vs 2) counts as wrong
    assert metrics["reward_margin"] == pytest.approx(0.25)
    assert metrics["rewards_chosen"] == pytest.approx(1.25)
    assert pairwise_metrics([], []) == {}
    with pytest.raises(ValueError):
        pairwise_metrics([1.0], [])


def test_unpaired_metrics_compare_every_desirable_with_every_undesirable():
    metrics = scoring.unpaired_metrics([3.0, 1.0], [2.0, 1.0, 0.0])
    assert metrics["reward_accuracy"] == pytest.approx(4 / 6)  # 3 beats all three; 1 beats only 0 (ties lose)
    assert metrics["reward_margin"] == pytest.approx(2.0 - 1.0)
    assert scoring.unpaired_metrics([1.0], []) == {}


def test_text_metrics_by_hand():
    metrics = text_metrics(["4", " hello world"], ["4", "hello there"])
    assert metrics["exact_match"] == 0.5
    assert metrics["rouge1"] == pytest.approx(0.75)  # 1.0 and F1 of {hello, world} vs {hello, there} = 0.5
    assert metrics["rouge2"] == pytest.approx(0.0)  # "4" has no bigram, the other pair shares none
    same = ["the cat sat on the mat", "a b c d e f"]
    assert text_metrics(same, same)["bleu4"] == pytest.approx(1.0)
    assert text_metrics(["x y z w"], ["p q r s"])["bleu4"] == pytest.approx(0.0)
    assert text_metrics(["42"], ["42"])["bleu4"] == pytest.approx(1.0)  # a right one-word answer is not 0
    assert text_metrics(["été chaud"], ["été chaud"])["rougeL"] == pytest.approx(1.0)  # non-ASCII words count


def test_rouge_is_rouge_scores_on_the_same_words():
    """Our ROUGE-1/2/L (computed here: rouge_score's import pulls in nltk and scipy) against rouge_score's F1 scores."""
    import random

    from rouge_score import rouge_scorer

    from tuneline.evaluation.generation import rouge_l, rouge_n, words

    class Words:  # rouge_score's scorer on the words we score
        def tokenize(self, text: str) -> list[str]:
            return words(text)

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], tokenizer=Words())
    pairs = [("the cat sat on the mat", "the cat is on the mat"), ("a a a b", "a b a"), ("", "x"), ("x", ""),
             ("", ""), ("été chaud, très chaud!", "chaud été"), ("1 2 3 4 5", "5 4 3 2 1"),
             ("to be or not to be", "to be is to do")]
    rng = random.Random(0)
    for _ in range(200):  # short texts over a small vocabulary: many repeats and partial matches
        pairs.append(tuple(" ".join(rng.choices("abcde", k=rng.randint(0, 12))) for _ in range(2)))
    for prediction, reference in pairs:
        expected = scorer.score(reference, prediction)
        said, wanted = words(prediction), words(reference)
        got = {"rouge1": rouge_n(said, wanted, 1), "rouge2": rouge_n(said, wanted, 2), "rougeL": rouge_l(said, wanted)}
        for name, value in got.items():
            assert value == pytest.approx(expected[name].fmeasure, abs=1e-12), (name, prediction, reference)


def test_label_scores_match_the_models_own_loss_and_ignore_padding(model_dir, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = sft_rows(tokenizer)
    batched = label_scores(model, rows["input_ids"], rows["labels"], tokenizer.pad_token_id, batch_size=4)
    single = label_scores(model, rows["input_ids"], rows["labels"], tokenizer.pad_token_id, batch_size=1)
    assert batched["tokens"] == single["tokens"] == [len(tokenizer.encode(ANSWER)) + 1] * len(QUESTIONS)
    assert batched["logp"] == pytest.approx(single["logp"], abs=1e-4)
    with torch.no_grad():
        own = model(input_ids=torch.tensor([rows["input_ids"][0]]), labels=torch.tensor([rows["labels"][0]])).loss
    assert -single["logp"][0] / single["tokens"][0] == pytest.approx(own.item(), rel=1e-5)
    metrics = loss_metrics(batched)
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["eval_loss"]))
    assert 0.0 <= metrics["token_accuracy"] <= 1.0
    projected = []  # rows batched by length, in any order, and only labelled positions projected
    hook = model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: projected.append(args[0].shape[:-1].numel()))
    try:
        reordered = label_scores(model, rows["input_ids"][::-1], rows["labels"][::-1], tokenizer.pad_token_id, 4)
    finally:
        hook.remove()
    assert reordered["logp"] == pytest.approx(batched["logp"][::-1], abs=1e-4)
    assert sum(projected) == sum(batched["tokens"])


def test_greedy_answers_come_back_in_the_prompts_order_whatever_their_lengths(model_dir, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    from tuneline.evaluation.generation import generate_greedy

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prompts = [tokenizer.encode(q) for q in ("Hi", "What is the capital of France, and why?", "Name a colour")]
    one_by_one = [generate_greedy(model, [p], pad_id=tokenizer.pad_token_id, eos_ids=set(), max_new_tokens=4,
                                  batch_size=1)[0] for p in prompts]
    batched = generate_greedy(model, prompts, pad_id=tokenizer.pad_token_id, eos_ids=set(), max_new_tokens=4,
                              batch_size=2)
    assert batched == one_by_one and len({tuple(a) for a in batched}) > 1


def test_sequence_logps_are_the_full_logits_log_probs_of_the_labelled_tokens(model_dir, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    from tuneline.objectives.logps import sequence_logps

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = sft_rows(tokenizer)
    ids = scoring.pad_rows(rows["input_ids"], tokenizer.pad_token_id)
    mask = scoring.pad_rows([[1] * len(r) for r in rows["input_ids"]], 0)
    labels = scoring.pad_rows(rows["labels"], -100)
    with torch.no_grad():
        sums, counts = sequence_logps(model, ids, mask, labels)
        logps = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits[:, :-1].float(), -1)
    counted = labels[:, 1:] != -100
    by_hand = (logps.gather(-1, labels[:, 1:].clamp(min=0).unsqueeze(-1)).squeeze(-1) * counted).sum(-1)
    assert torch.allclose(sums, by_hand, atol=1e-4) and counts.tolist() == counted.sum(-1).tolist()


# ----------------------------------------------------------------------------- evaluate_model
def test_evaluate_sft_scores_and_is_cached(model_dir, tokenizer, tmp_path):
    config = make_config(model_dir, tmp_path / "cache")
    ref = save_splits(tmp_path / "data", sft_rows(tokenizer))
    first = evaluate_model(config, ref, None, model_content_key(config))
    metrics = first["metrics"]
    assert first["cache_hit"] is False and first["num_samples"] == len(QUESTIONS)
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["eval_loss"]))
    for name in ("exact_match", "token_accuracy", "rouge1", "rouge2", "rougeL", "bleu4"):
        assert 0.0 <= metrics[name] <= 1.0, name
    folder = Path(first["path"])
    assert folder.parent.name == "evaluate" and folder.name == first["fingerprint"]
    assert json.loads((folder / "metrics.json").read_text()) == metrics
    predictions = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == config.pipeline.eval_max_samples
    assert {p["label"] for p in predictions} == {ANSWER}
    assert all(p["prompt"].endswith("assistant\n") for p in predictions)
    stamp = (folder / "metrics.json").stat().st_mtime_ns

    second = evaluate_model(config, ref, None, model_content_key(config))
    assert second["cache_hit"] is True and second["metrics"] == metrics
    assert (folder / "metrics.json").stat().st_mtime_ns == stamp

    refreshed = evaluate_model(make_config(model_dir, tmp_path / "cache", refresh_cache=True), ref, None,
                               model_content_key(config))
    assert refreshed["cache_hit"] is False and refreshed["metrics"] == pytest.approx(metrics)


def test_without_a_validation_split_the_evaluation_is_skipped_with_its_reason(model_dir, tokenizer, tmp_path):
    config = make_config(model_dir, tmp_path / "cache")
    ref = save_splits(tmp_path / "data", sft_rows(tokenizer), with_validation=False)
    skipped = evaluate_model(config, ref, None, "some-model")
    assert skipped["metrics"] == {} and "val_size" in skipped["skipped"] and skipped["path"] is None
    assert not list((tmp_path / "cache" / "evaluate").glob("*/COMPLETE"))
    with pytest.raises(UserError, match="val_size"):  # a dataset reference that does not say how many: loaded, refused
        evaluate_model(config, {k: v for k, v in ref.items() if k != "eval_rows"}, None, "some-model")


def test_trained_model_beats_base_on_exact_match_and_loss(model_dir, tokenizer, trained_dir, tmp_path):
    config = make_config(model_dir, tmp_path / "cache", eval_max_samples=6)
    ref = save_splits(tmp_path / "data", sft_rows(tokenizer))
    base = evaluate_model(config, ref, None, model_content_key(config))
    tuned = evaluate_model(config, ref, str(trained_dir), model_content_key(config, trained_dir))
    assert tuned["fingerprint"] != base["fingerprint"]
    assert base["metrics"]["exact_match"] == 0.0
    assert tuned["metrics"]["exact_match"] == 1.0
    assert tuned["metrics"]["token_accuracy"] == 1.0
    assert tuned["metrics"]["bleu4"] == pytest.approx(1.0) and tuned["metrics"]["rougeL"] == pytest.approx(1.0)
    assert tuned["metrics"]["eval_loss"] < base["metrics"]["eval_loss"]


def test_pairwise_reward_accuracy_for_dpo(model_dir, tokenizer, trained_dir, tmp_path):
    config = make_config(model_dir, tmp_path / "cache", stage="dpo")
    ref = save_splits(tmp_path / "data", pair_rows(tokenizer))
    tuned = evaluate_model(config, ref, str(trained_dir), "trained")["metrics"]
    assert tuned["reward_accuracy"] == 1.0 and tuned["reward_margin"] > 0  # it was trained to say 42, not 17
    assert "exact_match" not in tuned
    assert tuned["perplexity"] == pytest.approx(math.exp(tuned["eval_loss"]))
    same = save_splits(tmp_path / "same", {**pair_rows(tokenizer), **{
        f"rejected_{k}": v for k, v in sft_rows(tokenizer, ANSWER).items()}})
    tie = evaluate_model(config, same, str(trained_dir), "trained")["metrics"]
    assert tie["reward_accuracy"] == 0.0 and tie["reward_margin"] == pytest.approx(0.0, abs=1e-5)

    good, bad = sft_rows(tokenizer, ANSWER), sft_rows(tokenizer, WRONG)
    unpaired = {k: good[k] + bad[k] for k in good}
    unpaired["kto_tags"] = [True] * len(QUESTIONS) + [False] * len(QUESTIONS)
    kto = evaluate_model(make_config(model_dir, tmp_path / "cache", stage="kto"),
                         save_splits(tmp_path / "kto", unpaired), str(trained_dir), "trained")["metrics"]
    assert kto["reward_accuracy"] == 1.0 and kto["reward_margin"] > 0


def test_lora_adapter_is_loaded_on_the_base(model_dir, tokenizer, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    base_model = AutoModelForCausalLM.from_pretrained(model_dir)
    lora = LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base_model, lora).save_pretrained(tmp_path / "adapter")
    config = make_config(model_dir, tmp_path / "cache", stage="pt")
    ref = save_splits(tmp_path / "data", sft_rows(tokenizer))
    base = evaluate_model(config, ref, None, model_content_key(config))
    tuned = evaluate_model(config, ref, str(tmp_path / "adapter"), model_content_key(config, tmp_path / "adapter"))
    assert tuned["fingerprint"] != base["fingerprint"] and tuned["cache_hit"] is False
    assert tuned["metrics"]["eval_loss"] != pytest.approx(base["metrics"]["eval_loss"])
    assert "exact_match" not in base["metrics"]  # pt does not generate
    assert not (Path(base["path"]) / "predictions.jsonl").exists()


def test_bradley_terry_loss_by_hand():
    assert scoring.bradley_terry_loss([0.0], [0.0])["eval_loss"] == pytest.approx(math.log(2))
    assert scoring.bradley_terry_loss([1.0, -50.0], [0.0, 50.0])["eval_loss"] == pytest.approx(
        (math.log1p(math.exp(-1.0)) + 100.0) / 2)  # a margin of -100 does not overflow
    assert scoring.bradley_terry_loss([], []) == {}


def test_tuned_adapters_follow_how_training_stacked_them(model_dir, tmp_path):
    from tuneline.evaluation.loading import tuned_adapters

    assert tuned_adapters(make_config(model_dir, tmp_path), "out") == ["out"]
    stacked = make_config(model_dir, tmp_path, adapter_name_or_path="a1,a2")
    assert tuned_adapters(stacked, "out") == ["a1", "out"]  # training kept training a2, saved as out
    fresh = make_config(model_dir, tmp_path, adapter_name_or_path="a1,a2", create_new_adapter=True)
    assert tuned_adapters(fresh, "out") == ["a1", "a2", "out"]


def test_reward_model_scores_pairs_with_its_head(model_dir, tokenizer, tmp_path):
    """rm evaluates a sequence scorer (random head on the base, seeded); a LoRA rm adapter with its head loads too."""
    import torch

    from tuneline.evaluation.loading import load_eval_model
    from tuneline.evaluation.scoring import sequence_rewards
    from tuneline.model import load_model

    config = make_config(model_dir, tmp_path / "cache", stage="rm")
    ties = save_splits(tmp_path / "ties", {**pair_rows(tokenizer), **{
        f"rejected_{k}": v for k, v in sft_rows(tokenizer, ANSWER).items()}})
    tie = evaluate_model(config, ties, None, "base")["metrics"]
    assert tie == pytest.approx({"eval_loss": math.log(2), "reward_accuracy": 0.0, "reward_margin": 0.0,
                                 "rewards_chosen": tie["rewards_chosen"], "rewards_rejected": tie["rewards_chosen"]})

    scorer = load_eval_model(config, tokenizer, None)
    rows = sft_rows(tokenizer)["input_ids"]
    batched = sequence_rewards(scorer, rows, tokenizer.pad_token_id, batch_size=4)
    with torch.no_grad():
        alone = [scorer(input_ids=torch.tensor([r])).logits[0, 0].item() for r in rows]
    assert batched == pytest.approx(alone, abs=1e-4)  # right padding does not move the read-out token

    torch.manual_seed(3)
    trainable = load_model(config, tokenizer, is_trainable=True, add_valuehead=True)
    with torch.no_grad():
        for name, param in trainable.named_parameters():
            if "score" in name and param.requires_grad:
                param.add_(torch.randn_like(param))
    trainable.save_pretrained(tmp_path / "rm_adapter")
    pairs = save_splits(tmp_path / "pairs", pair_rows(tokenizer))
    base = evaluate_model(config, pairs, None, "base")["metrics"]
    tuned = evaluate_model(config, pairs, str(tmp_path / "rm_adapter"), "tuned")["metrics"]
    assert 0.0 <= tuned["reward_accuracy"] <= 1.0 and tuned["eval_loss"] > 0
    assert tuned["rewards_chosen"] != pytest.approx(base["rewards_chosen"])
