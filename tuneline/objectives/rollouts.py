"""Answers sampled from a policy and scored by the reward model: PPO's rollouts and its evaluation metric.

PPO samples its rollouts here, and the flow's `evaluate` step measures a tuned ppo policy with `sampled_reward`: one
seeded sampling for both, below `tuneline.train` and `tuneline.evaluation`, so before and after are measured on the
same prompts with the same noise. torch is imported inside the functions.
"""

from __future__ import annotations

from tuneline.objectives.rewards import sequence_scores


def response_mask(response_ids, eos_token_id: int):
    """1 on response tokens up to and including the first eos, 0 after it."""

    is_eos = (response_ids == eos_token_id).long()
    after_eos = (is_eos.cumsum(-1) - is_eos) > 0
    return (~after_eos).float()


def right_aligned(prompt_ids, prompt_mask, answers, answer_mask, pad_id: int):
    """Drop the prompts' left padding: rows of real prompt tokens then the answer, padded on the right."""
    import torch

    rows, marks = [], []
    for ids, keep, answer, amask in zip(prompt_ids, prompt_mask, answers, answer_mask, strict=True):
        prompt = ids[keep.bool()]
        answer = answer[: int(amask.sum())]
        rows.append(torch.cat((prompt, answer)))
        marks.append(torch.cat((torch.zeros_like(prompt), torch.ones_like(answer))))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=rows[0].dtype)
    attention = torch.zeros_like(ids)
    action = torch.zeros(len(rows), width)
    for i, (row, mark) in enumerate(zip(rows, marks, strict=True)):
        ids[i, : len(row)], attention[i, : len(row)], action[i, : len(row)] = row, 1, mark.float()
    return ids, attention, action[:, 1:]


def sample_answers(policy, tokenizer, batch, gen):
    """Answers sampled with the generating config, right-aligned after their prompts: (ids, attention, mask)."""
    import torch

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    policy.eval()
    with torch.no_grad():
        out = policy.generate(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], do_sample=gen.do_sample,
            temperature=gen.temperature, top_p=gen.top_p, top_k=gen.top_k, max_new_tokens=gen.max_new_tokens,
            repetition_penalty=gen.repetition_penalty, pad_token_id=pad_id, eos_token_id=tokenizer.eos_token_id)
        answers = out[:, batch["input_ids"].size(1):]
        answer_mask = response_mask(answers, tokenizer.eos_token_id)
        answer_mask[:, 0] = 1  # at least one token, even if it is eos
        return right_aligned(batch["input_ids"], batch["attention_mask"], answers, answer_mask, pad_id)


def sampled_reward(policy, reward_model, tokenizer, dataset, collator, gen, seed: int, batch_size: int,
                   limit: int) -> float:
    """Mean reward-model score of answers sampled for the first `limit` prompts: PPO's evaluation metric.

    Sampling starts from `seed` every time, so the policy before and after training (in the trainer and in the
    flow's `evaluate` step) is measured on the same prompts with the same noise: a paired comparison.
    """
    import torch

    device = next(policy.parameters()).device
    rows = [dataset[i] for i in range(min(limit, len(dataset)))]
    scores = []
    with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for start in range(0, len(rows), batch_size):
            batch = collator(rows[start:start + batch_size])
            batch = {k: v.to(device) for k, v in batch.items() if hasattr(v, "to")}
            ids, attention, _ = sample_answers(policy, tokenizer, batch, gen)
            scores.append(sequence_scores(reward_model, ids, attention).float())
        return torch.cat(scores).mean().item()
