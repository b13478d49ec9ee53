"""Reward modelling: a one-output scorer trained on pairs with -logsigmoid(r_chosen - r_rejected), the score
read at each sequence's last non-padding token (`tuneline.objectives.rewards.sequence_scores`, the read-out PPO and the
evaluation use too); evaluation reports pairwise accuracy.

Run: `python -m tuneline.train examples/rm_lora.yaml`.
"""

from __future__ import annotations

from functools import partial

from tuneline.objectives.logps import MEDIA_INPUTS
from tuneline.objectives.rewards import sequence_scores
from tuneline.train.trainer_base import StageSpec, TunelineTrainer, run_stage


def pairwise_loss(chosen, rejected):
    """Bradley-Terry loss of a batch: mean of -log sigmoid(r_chosen - r_rejected)."""
    import torch.nn.functional as F

    return -F.logsigmoid(chosen.float() - rejected.float()).mean()


def _pad_to(tensor, width: int, value: int):
    import torch.nn.functional as F

    return F.pad(tensor, (0, width - tensor.shape[1]), value=value)


def pair_scores(model, inputs):
    """Scores of the chosen and rejected sides, in one forward pass over both (with each row's images twice, once
    per side, where the rows hold images)."""
    import torch

    width = max(inputs["chosen_input_ids"].shape[1], inputs["rejected_input_ids"].shape[1])
    pad_id = getattr(getattr(model, "config", None), "pad_token_id", None) or 0
    ids = torch.cat([_pad_to(inputs["chosen_input_ids"], width, pad_id),
                     _pad_to(inputs["rejected_input_ids"], width, pad_id)])
    mask = torch.cat([_pad_to(inputs["chosen_attention_mask"], width, 0),
                      _pad_to(inputs["rejected_attention_mask"], width, 0)])
    scores = sequence_scores(model, ids, mask, **inputs.get(MEDIA_INPUTS, {}))
    return scores.chunk(2)


class PairwiseTrainer(TunelineTrainer):
    """Trainer over chosen/rejected pairs: pairwise loss in training, (chosen, rejected) scores in evaluation."""

    counts_pair_tokens = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.model_accepts_loss_kwargs = False  # the loss is a per-batch mean, not a token sum

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        chosen, rejected = pair_scores(model, inputs)
        loss = pairwise_loss(chosen, rejected)
        return (loss, {"chosen": chosen, "rejected": rejected}) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        import torch

        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            chosen, rejected = pair_scores(model, inputs)
            loss = pairwise_loss(chosen, rejected).detach()
        if prediction_loss_only:
            return loss, None, None
        scores = torch.stack([chosen, rejected], dim=-1).float()
        return loss, scores, torch.zeros(len(chosen), device=scores.device)  # labels: the Trainer wants some


def pairwise_accuracy(eval_prediction) -> dict[str, float]:
    import numpy as np

    scores = np.asarray(eval_prediction.predictions)
    margins = scores[:, 0] - scores[:, 1]
    return {"accuracy": float((margins > 0).mean()), "margin": float(margins.mean()),
            "rewards_chosen": float(scores[:, 0].mean()), "rewards_rejected": float(scores[:, 1].mean())}


def rm_metrics(config, tokenizer):
    return pairwise_accuracy, None


SPEC = StageSpec(name="rm", trainer_class=PairwiseTrainer, add_valuehead=True, metrics=rm_metrics)


run = partial(run_stage, spec=SPEC)  # the stage interface: run(config, dataset_ref, extra_callbacks)
