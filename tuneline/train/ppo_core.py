"""PPO's arithmetic as pure functions of tensors: per-token rewards with the KL penalty, GAE, the clipped policy
and value losses, and the adaptive KL coefficient. No model and no trainer state, so each is tested alone.

Shapes: [batch, response_length] with `mask` 1 on real response tokens (up to and including eos), 0 after
(`tuneline.objectives.rewards.response_mask`, shared with the evaluation's sampling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class AdaptiveKL:
    """Ziegler et al.'s controller: the KL coefficient grows when the measured KL exceeds `target`, shrinks below.

    coef *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon
    """

    coef: float = 0.2
    target: float | None = 6.0
    horizon: float = 10000.0

    def update(self, kl: float, n_steps: int) -> float:
        if self.target:
            error = min(max(kl / self.target - 1.0, -0.2), 0.2)
            self.coef *= 1.0 + error * n_steps / self.horizon
        return self.coef

    def state_dict(self) -> dict:
        """The coefficient reached (a checkpoint's); target and horizon come from the config."""
        return {"coef": self.coef}

    def load_state_dict(self, state: dict) -> None:
        self.coef = state["coef"]


def masked_mean(values, mask, dim=None):
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_whiten(values, mask, shift_mean: bool = True, total=None):
    """Zero-mean unit-variance over the masked entries (the mean is kept when `shift_mean` is false).

    `total` sums a tensor over the training processes: with it the statistics are those of every process's
    entries together, as one process holding the whole rollout would compute them.
    """
    total = total or (lambda tensor: tensor)
    count = total(mask.sum()).clamp(min=1)
    mean = total((values * mask).sum()) / count
    var = total((((values - mean) ** 2) * mask).sum()) / count
    whitened = (values - mean) * (var + 1e-8).rsqrt()
    return (whitened if shift_mean else whitened + mean) * mask


def token_rewards(scores, logps, ref_logps, mask, kl_coef: float):
    """Per-token rewards: -kl_coef * (logp - ref_logp) on every response token, plus the sequence score on the
    last one. Returns (rewards, per-token KL estimate)."""
    import torch

    kl = (logps - ref_logps) * mask
    rewards = -kl_coef * kl
    positions = torch.arange(mask.size(1), device=mask.device)
    last = (positions * mask).argmax(-1)  # the last answer token, wherever the answer starts
    rows = torch.arange(len(scores), device=scores.device)
    rewards[rows, last] += scores
    return rewards * mask, kl


def gae(rewards, values, mask, gamma: float = 1.0, lam: float = 0.95):
    """Generalised advantage estimates and returns (advantages + values), both zero after each response."""
    import torch

    values = values * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.size(1))):
        next_value = values[:, t + 1] if t + 1 < rewards.size(1) else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * running) * mask[:, t]
        advantages[:, t] = running
    return advantages, (advantages + values) * mask


def policy_loss(logps, old_logps, advantages, mask, clip: float = 0.2):
    """Clipped surrogate: mean over tokens of max(-A r, -A clip(r, 1-e, 1+e)); also the clipped fraction."""
    import torch

    ratio = torch.exp(logps - old_logps)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    return loss, masked_mean((clipped > unclipped).float(), mask)


def value_loss(values, old_values, returns, mask, clip: float = 0.2):
    """Clipped value loss: 0.5 * mean of max((v - R)^2, (clip(v, v_old +- e) - R)^2)."""
    import torch

    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    return 0.5 * masked_mean(torch.maximum((values - returns) ** 2, (clipped - returns) ** 2), mask)


def finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0
