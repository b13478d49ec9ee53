"""Reward functions of examples/grpo_lora_demo.yaml, called by trl as reward(prompts=, completions=, solution=, ...).

Each returns one float per completion. The demo's tiny model starts from random weights, so the rewards are
dense (a share, not a pass/fail) to give GRPO a signal from the first step."""


def digit_share(completions, **kwargs):
    """The share of an answer's non-space characters that are digits: the demo tasks mostly answer with numbers."""
    shares = []
    for text in completions:
        chars = [ch for ch in text if not ch.isspace()]
        shares.append(sum(ch.isdigit() for ch in chars) / len(chars) if chars else 0.0)
    return shares


def concise(completions, completion_ids, **kwargs):
    """1.0 for a one-token answer, falling to 0.0 at 8 tokens (the demo's max_completion_length); an empty answer
    earns nothing, or stopping at once would be the easiest reward to win."""
    pairs = zip(completions, completion_ids, strict=True)
    return [max(0.0, 1.0 - (len(ids) - 1) / 8) if text.strip() else 0.0 for text, ids in pairs]
