"""Preference losses as pure functions of per-sequence log-probs: no model, no trainer state.

The definitions match LLaMA-Factory and trl. ipo, orpo and simpo expect length-normalised log-probs
(`LENGTH_NORMALISED`); orpo and simpo use no reference model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Losses computed on mean per-token log-probs rather than sums (LLaMA-Factory's convention).
LENGTH_NORMALISED = frozenset({"ipo", "orpo", "simpo"})
# Losses that need no reference model at all.
REFERENCE_FREE = frozenset({"orpo", "simpo"})


@dataclass
class PreferenceLoss:
    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor
    parts: dict[str, torch.Tensor] = field(default_factory=dict)


def sigmoid_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float,
                 label_smoothing: float = 0.0, **_) -> PreferenceLoss:
    """DPO: -log sigmoid(beta * margin); with label smoothing eps, a mix with the flipped preference (cDPO)."""
    import torch.nn.functional as F

    margin = _margin(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps)
    losses = (-F.logsigmoid(beta * margin) * (1 - label_smoothing)
              - F.logsigmoid(-beta * margin) * label_smoothing)
    return _with_ref_rewards(losses, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)


def hinge_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float,
               **_) -> PreferenceLoss:
    """SLiC-style hinge: relu(1 - beta * margin)."""
    import torch

    margin = _margin(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps)
    losses = torch.relu(1 - beta * margin)
    return _with_ref_rewards(losses, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)


def ipo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float,
             **_) -> PreferenceLoss:
    """IPO: (margin - 1 / (2 beta))^2, on mean per-token log-probs."""
    margin = _margin(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps)
    losses = (margin - 1 / (2 * beta)) ** 2
    return _with_ref_rewards(losses, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)


def orpo_loss(chosen_logps, rejected_logps, beta: float, **_) -> PreferenceLoss:
    """ORPO: NLL of chosen plus beta * -log sigmoid(log odds ratio), on mean per-token log-probs.

    odds(y) = p / (1 - p) with p = exp(mean logp); log1p(-exp(x)) keeps 1 - p accurate when p is small.
    """
    import torch
    import torch.nn.functional as F

    log_odds = (chosen_logps - rejected_logps) - (
        torch.log1p(-torch.exp(chosen_logps)) - torch.log1p(-torch.exp(rejected_logps)))
    sft = -chosen_logps
    odds_ratio = -F.logsigmoid(log_odds)
    return PreferenceLoss(sft + beta * odds_ratio, *_policy_rewards(chosen_logps, rejected_logps, beta),
                          parts={"sft_loss": sft.detach(), "odds_ratio_loss": odds_ratio.detach()})


def simpo_loss(chosen_logps, rejected_logps, beta: float, simpo_gamma: float = 0.5, **_) -> PreferenceLoss:
    """SimPO: -log sigmoid(beta * (mean logp chosen - mean logp rejected) - gamma); no reference."""
    import torch.nn.functional as F

    losses = -F.logsigmoid(beta * (chosen_logps - rejected_logps) - simpo_gamma)
    return PreferenceLoss(losses, *_policy_rewards(chosen_logps, rejected_logps, beta))


PAIRWISE_LOSSES = {
    "sigmoid": sigmoid_loss,
    "hinge": hinge_loss,
    "ipo": ipo_loss,
    "orpo": orpo_loss,
    "simpo": simpo_loss,
}


def pairwise_loss(name: str, chosen_logps, rejected_logps, ref_chosen_logps=None, ref_rejected_logps=None, *,
                  beta: float, label_smoothing: float = 0.0, simpo_gamma: float = 0.5) -> PreferenceLoss:
    """The `pref_loss` named `name`; reference log-probs are ignored by the reference-free losses."""
    if name not in PAIRWISE_LOSSES:
        raise ValueError(f"unknown pref_loss '{name}'; allowed: {', '.join(PAIRWISE_LOSSES)}")
    if name not in REFERENCE_FREE and (ref_chosen_logps is None or ref_rejected_logps is None):
        raise ValueError(f"pref_loss '{name}' needs reference log-probs")
    return PAIRWISE_LOSSES[name](chosen_logps, rejected_logps, ref_chosen_logps=ref_chosen_logps,
                                 ref_rejected_logps=ref_rejected_logps, beta=beta,
                                 label_smoothing=label_smoothing, simpo_gamma=simpo_gamma)


def kto_loss(chosen_logps, rejected_logps, kl_logps, ref_chosen_logps, ref_rejected_logps, ref_kl_logps,
             beta: float, chosen_weight: float = 1.0, rejected_weight: float = 1.0) -> PreferenceLoss:
    """KTO: desirable rows pay 1 - sigmoid(beta (r - z)), undesirable ones 1 - sigmoid(beta (z - r)).

    z, the KL baseline from mismatched (prompt, completion) pairs, is clamped at 0 and detached, as in trl."""
    import torch

    kl = (kl_logps - ref_kl_logps).mean().detach().clamp(min=0) if kl_logps.numel() else kl_logps.new_zeros(())
    chosen_ratio = chosen_logps - ref_chosen_logps
    rejected_ratio = rejected_logps - ref_rejected_logps
    chosen_losses = 1 - torch.sigmoid(beta * (chosen_ratio - kl))
    rejected_losses = 1 - torch.sigmoid(beta * (kl - rejected_ratio))
    losses = torch.cat((chosen_weight * chosen_losses, rejected_weight * rejected_losses), 0)
    return PreferenceLoss(losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach(), parts={"kl": kl})


def _margin(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps):
    return (chosen_logps - rejected_logps) - (ref_chosen_logps - ref_rejected_logps)


def _with_ref_rewards(losses, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta):
    return PreferenceLoss(losses, beta * (chosen_logps - ref_chosen_logps).detach(),
                          beta * (rejected_logps - ref_rejected_logps).detach())


def _policy_rewards(chosen_logps, rejected_logps, beta):
    return beta * chosen_logps.detach(), beta * rejected_logps.detach()


# --- sft


def dft_loss(outputs, labels, num_items_in_batch=None):
    """Dynamic Fine-Tuning (Wu et al. 2025, LLaMA-Factory's `use_dft_loss`): each label token's cross-entropy
    weighted by its probability under the model, detached, so confident tokens count more; summed over the label
    tokens and divided by `num_items_in_batch` (the Trainer's count over the accumulated batches), else averaged.
    `outputs` holds the model's logits; labels are unshifted (-100 never counts)."""
    import torch

    logits = outputs["logits"].float()
    next_labels = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].reshape(-1).to(logits.device)
    per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), next_labels,
                                                  ignore_index=-100, reduction="none")
    counted = per_token[next_labels != -100]
    if counted.numel() == 0:
        return logits.sum() * 0.0  # keeps the graph: a batch without label tokens trains nothing
    weighted = counted * torch.exp(-counted.detach())
    if num_items_in_batch is None:
        return weighted.mean()
    return weighted.sum() / torch.as_tensor(num_items_in_batch, device=weighted.device)
