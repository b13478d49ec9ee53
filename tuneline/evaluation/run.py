"""One evaluation: load tokenizer, data and model, then run the stage's metric steps from a table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuneline.content.records import BuiltDataset
from tuneline.evaluation import generation, scoring
from tuneline.evaluation.loading import load_eval_model, load_validation
from tuneline.evaluation.sampled_rewards import reward_functions_step

DEFAULT_EVAL_BATCH_SIZE = 8


@dataclass
class EvalContext:
    config: Any
    model: Any
    tokenizer: Any
    data: Any  # the validation split (a datasets.Dataset)
    batch_size: int
    predictions: list[dict[str, str]]
    media: Any = None  # a Collator with the run's media when the rows hold images or videos

    def row_inputs(self, ids: list[list[int]], data_rows: list[int] | None = None):
        """`(chunk, length, left) -> inputs`: the pixels of the images of `ids[k]` for k in chunk (the validation
        rows `data_rows[k]`, by default row k), or None for text rows."""
        if self.media is None:
            return None

        def inputs(chunk: list[int], length: int, left: bool) -> dict:
            rows = [self.data[data_rows[k] if data_rows else k] for k in chunk]
            features = [{"input_ids": ids[k], "images": row["images"], "videos": row["videos"]}
                        for k, row in zip(chunk, rows, strict=True)]
            return self.media.media_inputs(features, length, left)

        return inputs

    def row_media(self, row: int) -> dict:
        """The image paths of validation row `row`, for the answers' record (the model card shows a few); {} for
        text."""
        if self.media is None or not self.data[row]["images"]:
            return {}
        return {"images": list(self.data[row]["images"])}

    def readable_prompt(self, text: str) -> str:
        """A decoded prompt with each image's tokens (hundreds for some models) written as one <image>."""
        return text if self.media is None else self.media.media.plugin.readable(text)


def language_model_step(ctx: EvalContext) -> dict[str, float]:
    """eval_loss, perplexity and token accuracy over the label tokens of every validation row."""
    if "labels" not in ctx.data.column_names:
        return {}
    input_ids = ctx.data["input_ids"]
    scores = scoring.label_scores(ctx.model, input_ids, ctx.data["labels"], ctx.tokenizer.pad_token_id,
                                  ctx.batch_size, ctx.row_inputs(input_ids))
    return scoring.loss_metrics(scores)


def generation_step(ctx: EvalContext) -> dict[str, float]:
    """Greedy answers to up to eval_max_samples prompts, scored against the reference answers."""
    pipeline = ctx.config.pipeline
    eos_ids = generation.eos_token_ids(ctx.tokenizer, ctx.model)
    pairs, rows = [], []
    for row, (input_ids, labels) in enumerate(zip(ctx.data["input_ids"], ctx.data["labels"], strict=True)):
        if len(pairs) >= pipeline.eval_max_samples:
            break
        split = generation.split_prompt_answer(input_ids, labels, eos_ids)
        if split is not None:
            pairs.append(split)
            rows.append(row)
    if not pairs:
        return {}
    prompts = [prompt for prompt, _ in pairs]
    answers = generation.generate_greedy(
        ctx.model, prompts, pad_id=ctx.tokenizer.pad_token_id, eos_ids=eos_ids,
        max_new_tokens=pipeline.eval_max_new_tokens, batch_size=ctx.batch_size,
        row_inputs=ctx.row_inputs(prompts, rows))
    decode = ctx.tokenizer.decode
    predictions = [decode(a, skip_special_tokens=True) for a in answers]
    references = [decode(ref, skip_special_tokens=True) for _, ref in pairs]
    ctx.predictions += [{"prompt": ctx.readable_prompt(decode(p)), "predict": pred, "label": ref,
                         **ctx.row_media(row)}
                        for (p, _), pred, ref, row in zip(pairs, predictions, references, rows, strict=True)]
    return generation.text_metrics(predictions, references)


def pairwise_step(ctx: EvalContext) -> dict[str, float]:
    """Loss on the chosen responses, and reward accuracy/margin with the summed label log-prob as reward."""
    if "chosen_input_ids" not in ctx.data.column_names:
        return unpaired_step(ctx)
    chosen, rejected = (side_scores(ctx, side) for side in ("chosen", "rejected"))
    return {**scoring.loss_metrics(chosen), **scoring.pairwise_metrics(chosen["logp"], rejected["logp"])}


def side_scores(ctx: EvalContext, side: str) -> dict[str, list]:
    """label_scores of one side of the pairs, each sequence with its row's images."""
    input_ids = ctx.data[f"{side}_input_ids"]
    return scoring.label_scores(ctx.model, input_ids, ctx.data[f"{side}_labels"], ctx.tokenizer.pad_token_id,
                                ctx.batch_size, ctx.row_inputs(input_ids))


def unpaired_step(ctx: EvalContext) -> dict[str, float]:
    """KTO's unpaired rows (kto_tags true = desirable): loss over all rows, reward accuracy over every
    (desirable, undesirable) combination, the summed label log-prob again standing in for the reward."""
    if "labels" not in ctx.data.column_names:
        return {}
    input_ids = ctx.data["input_ids"]
    scores = scoring.label_scores(ctx.model, input_ids, ctx.data["labels"], ctx.tokenizer.pad_token_id,
                                  ctx.batch_size, ctx.row_inputs(input_ids))
    metrics = scoring.loss_metrics(scores)
    if "kto_tags" in ctx.data.column_names:
        tags = list(ctx.data["kto_tags"])
        desirable = [r for r, tag in zip(scores["logp"], tags, strict=True) if tag]
        undesirable = [r for r, tag in zip(scores["logp"], tags, strict=True) if not tag]
        metrics.update(scoring.unpaired_metrics(desirable, undesirable))
    return metrics


def reward_model_step(ctx: EvalContext) -> dict[str, float]:
    """A reward model scores each side itself: Bradley-Terry eval loss, reward accuracy and margin."""
    chosen, rejected = (side_rewards(ctx, side) for side in ("chosen", "rejected"))
    return {**scoring.bradley_terry_loss(chosen, rejected), **scoring.pairwise_metrics(chosen, rejected)}


def side_rewards(ctx: EvalContext, side: str) -> list[float]:
    """The reward model's score of each sequence of one side of the pairs, with its row's images."""
    input_ids = ctx.data[f"{side}_input_ids"]
    return scoring.sequence_rewards(ctx.model, input_ids, ctx.tokenizer.pad_token_id, ctx.batch_size,
                                    ctx.row_inputs(input_ids))


def policy_reward_step(ctx: EvalContext) -> dict[str, float]:
    """PPO's measure: the reward model's mean score of answers sampled (generating config, fixed seed) for the
    first eval_max_samples prompts; the trainer reports the same number before and after training."""
    from tuneline.data import build_collator
    from tuneline.objectives.rewards import load_reward_model
    from tuneline.objectives.rollouts import sampled_reward

    ctx.tokenizer.padding_side = "left"
    reward_model = load_reward_model(ctx.config, ctx.tokenizer).to(next(ctx.model.parameters()).device).eval()
    collator = build_collator("ppo", ctx.tokenizer, ctx.config.data.pad_to_multiple_of)
    reward = sampled_reward(ctx.model, reward_model, ctx.tokenizer, ctx.data, collator, ctx.config.generating,
                            seed=int(ctx.config.training.get("seed", 42)), batch_size=ctx.batch_size,
                            limit=ctx.config.pipeline.eval_max_samples)
    return {"reward": reward}


STAGE_STEPS: dict[str, tuple[Callable[[EvalContext], dict[str, float]], ...]] = {
    "pt": (language_model_step,),
    "sft": (language_model_step, generation_step),
    "rm": (reward_model_step,),
    "dpo": (pairwise_step,),
    "kto": (pairwise_step,),
    "ppo": (policy_reward_step,),
    "grpo": (reward_functions_step,),
    "rloo": (reward_functions_step,),
}


def eval_context(config, dataset_ref: BuiltDataset | dict[str, Any], adapter_dir: str | None) -> EvalContext:
    """The validation split, tokenizer and model (at adapter_dir, or the base) that an evaluation or a prediction
    runs on; torch seeded from `seed`."""
    import torch

    from tuneline.data import build_collator
    from tuneline.data.mm.run_media import dataset_media
    from tuneline.model import load_tokenizer

    torch.manual_seed(int(config.training.get("seed", 42)))
    data = load_validation(dataset_ref)  # first: a missing split fails before any model is loaded
    tokenizer = load_tokenizer(config.model)
    model = load_eval_model(config, tokenizer, adapter_dir)
    batch_size = int(config.training.get("per_device_eval_batch_size") or DEFAULT_EVAL_BATCH_SIZE)
    media = dataset_media(config, tokenizer, [data])
    return EvalContext(config, model, tokenizer, data, batch_size, predictions=[],
                       media=media and build_collator(config.stage, tokenizer, media=media))


def run_evaluation(config, dataset_ref: BuiltDataset | dict[str, Any], adapter_dir: str | None) -> dict[str, Any]:
    """{"metrics", "num_samples", "predictions"} for the model at adapter_dir (or the base model)."""
    ctx = eval_context(config, dataset_ref, adapter_dir)
    metrics: dict[str, float] = {}
    for step in STAGE_STEPS[config.stage]:
        metrics.update(step(ctx))
    return {"metrics": metrics, "num_samples": len(ctx.data), "predictions": ctx.predictions}
