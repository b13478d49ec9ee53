"""grpo's measure: answers sampled for held-out prompts, scored by the run's own reward functions.

The base and the tuned model answer the same prompts with the same seed and the generating config's sampling
(`temperature`, `top_p`, `top_k`), up to `max_completion_length` tokens as in training, so the before/after table
compares each reward's mean, and their weighted total, on paired samples."""

from __future__ import annotations

from typing import Any


def sample_completions(model, tokenizer, prompts: list[str], config, batch_size: int, seed: int) -> list[list[int]]:
    """One sampled answer per prompt (token ids, up to the first eos), from the prompt text as trl tokenizes it."""
    import torch

    gen, device = config.generating, next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    answers: list[list[int]] = []
    model.eval()
    with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for start in range(0, len(prompts), batch_size):
            batch = tokenizer(prompts[start:start + batch_size], return_tensors="pt", padding=True,
                              padding_side="left", add_special_tokens=False).to(device)
            out = model.generate(**batch, do_sample=True, temperature=gen.temperature, top_p=gen.top_p,
                                 top_k=gen.top_k, repetition_penalty=gen.repetition_penalty,
                                 max_new_tokens=config.grpo.max_completion_length, pad_token_id=pad_id,
                                 eos_token_id=tokenizer.eos_token_id)
            for row in out[:, batch["input_ids"].shape[1]:].tolist():
                cut = row.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in row else len(row)
                answers.append(row[:cut])
    return answers


def reward_means(funcs, names: list[str], weights: list[float] | None, prompts: list[str], completions: list[str],
                 completion_ids: list[list[int]], solutions: list[str]) -> dict[str, float]:
    """Each reward's mean over the answers it scored (None: not scored, as trl reads it) and the weighted total."""
    weights = weights or [1.0] * len(funcs)
    metrics, total = {}, 0.0
    for func, name, weight in zip(funcs, names, weights, strict=True):
        values = func(prompts=prompts, completions=completions, completion_ids=completion_ids, solution=solutions,
                      trainer_state=None, log_extra=lambda *_args, **_kw: None, log_metric=lambda *_args, **_kw: None)
        scored = [float(v) for v in values if v is not None]
        mean = sum(scored) / len(scored) if scored else 0.0
        metrics[f"reward_{name}"] = mean
        total += float(weight) * mean
    metrics["reward"] = total
    return metrics


def reward_functions_step(ctx) -> dict[str, Any]:
    """`reward` (the weighted total) and `reward_<name>` per reward function, over eval_max_samples prompts."""
    from tuneline.objectives.grpo_rewards import resolve_reward_funcs

    config, tokenizer = ctx.config, ctx.tokenizer
    rows = ctx.data.select(range(min(config.pipeline.eval_max_samples, len(ctx.data))))
    prompts, solutions = list(rows["prompt"]), list(rows["solution"])
    funcs, names = resolve_reward_funcs(config, tokenizer, next(ctx.model.parameters()).device)
    ids = sample_completions(ctx.model, tokenizer, prompts, config, ctx.batch_size,
                             seed=int(config.training.get("seed", 42)))
    completions = tokenizer.batch_decode(ids, skip_special_tokens=True)
    ctx.predictions += [{"prompt": p, "predict": c, "label": s} for p, c, s in zip(prompts, completions, solutions,
                                                                                    strict=True)]
    return reward_means(funcs, names, config.grpo.reward_weights, prompts, completions, ids, solutions)
