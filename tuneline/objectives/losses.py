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


def _label_token_losses(outputs, labels):
    """(each label token's cross-entropy, the logits at those positions); labels unshifted, -100 never counts."""
    import torch

    logits = outputs["logits"].float()
    next_labels = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].reshape(-1).to(logits.device)
    flat = logits.reshape(-1, logits.size(-1))
    counted = next_labels != -100
    per_token = torch.nn.functional.cross_entropy(flat[counted], next_labels[counted], reduction="none")
    return per_token, flat[counted], logits


def _reduce(weighted, num_items_in_batch):
    """Summed over the label tokens and divided by `num_items_in_batch` (the Trainer's count over the accumulated
    batches), else averaged."""
    import torch

    if num_items_in_batch is None:
        return weighted.mean()
    return weighted.sum() / torch.as_tensor(num_items_in_batch, device=weighted.device)


def dft_loss(outputs, labels, num_items_in_batch=None):
    """Dynamic Fine-Tuning (Wu et al. 2025, LLaMA-Factory's `use_dft_loss`): each label token's cross-entropy
    weighted by its probability under the model, detached, so confident tokens count more. `outputs` holds the
    model's logits; labels are unshifted (-100 never counts)."""
    import torch

    counted, _, logits = _label_token_losses(outputs, labels)
    if counted.numel() == 0:
        return logits.sum() * 0.0  # keeps the graph: a batch without label tokens trains nothing
    return _reduce(counted * torch.exp(-counted.detach()), num_items_in_batch)


EAFT_TOP_K = 20  # the entropy is estimated over the 20 likeliest next tokens
EAFT_SCALE = 3.0  # and divided by 3 (about log 20), so that a flat top-20 weighs about 1


def eaft_loss(outputs, labels, num_items_in_batch=None, alpha: float = 1.0):
    """Entropy-Adaptive Fine-Tuning (LLaMA-Factory's `use_eaft_loss`): each label token's cross-entropy weighted by
    (H / 3) ** alpha, H the entropy of the model's next-token distribution renormalised over its top 20 logits,
    detached: where the model is unsure, the token counts more; where it is sure (and maybe confidently wrong, a
    fact it already holds), less."""
    import torch

    counted, position_logits, logits = _label_token_losses(outputs, labels)
    if counted.numel() == 0:
        return logits.sum() * 0.0
    with torch.no_grad():
        top = torch.topk(position_logits, k=min(EAFT_TOP_K, position_logits.size(-1)), dim=-1).values
        log_probs = torch.log_softmax(top, dim=-1)
        entropy = -(log_probs.exp() * log_probs).sum(dim=-1)
        weights = (entropy / EAFT_SCALE) ** alpha
    return _reduce(counted * weights, num_items_in_batch)


def asft_loss(outputs, labels, reference_logits, alpha: float = 0.1):
    """Anchored SFT (LLaMA-Factory's `use_asft_loss`): the DFT loss, averaged over the label tokens, plus alpha
    times KL(reference || model) of the full next-token distributions at those tokens, averaged the same way. The
    reference is the model as it was before training, so the anchor keeps DFT's reweighting from drifting far."""
    import torch

    counted, position_logits, logits = _label_token_losses(outputs, labels)
    if counted.numel() == 0:
        return logits.sum() * 0.0
    dft = (counted * torch.exp(-counted.detach())).mean()
    next_labels = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].reshape(-1).to(logits.device)
    reference = reference_logits.float().reshape(-1, reference_logits.size(-1))[next_labels != -100]
    kl = torch.nn.functional.kl_div(torch.log_softmax(position_logits, dim=-1), torch.softmax(reference, dim=-1),
                                    reduction="none").sum(dim=-1)
    return dft + alpha * kl.mean()
