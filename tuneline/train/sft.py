"""Supervised fine-tuning: causal LM loss over response tokens only (labels -100 never count), or Dynamic
Fine-Tuning's probability-weighted one (`use_dft_loss`), token accuracy when `compute_accuracy`, and generated
answers scored by ROUGE/BLEU when `predict_with_generate`.

A training step projects onto the vocabulary only the positions whose next token is a label (transformers'
`logits_to_keep` mask and `shift_labels`): prompt and padding positions would be projected, then ignored by the
loss. Same loss and gradients, less of the step's largest matmul and of its largest tensor (logits by vocabulary).

Run: `python -m tuneline.train examples/sft_lora.yaml` (or through `accelerate launch`).
"""

from __future__ import annotations

import functools

from tuneline.logps import projects_selected_positions
from tuneline.train.predict import predict_with_generate
from tuneline.train.trainer_base import StageSpec, TunelineTrainer, run_stage

IGNORE_INDEX = -100


def argmax_logits(logits, labels):
    """Keep only the predicted ids: whole-vocabulary logits for an eval set do not fit in memory."""
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    return logits.argmax(dim=-1)


def token_accuracy(eval_prediction) -> dict[str, float]:
    """Share of label tokens (labels != -100) whose next-token prediction is right."""
    import numpy as np

    preds, labels = np.asarray(eval_prediction.predictions), np.asarray(eval_prediction.label_ids)
    preds, labels = preds[:, :-1], labels[:, 1:]
    counted = labels != IGNORE_INDEX
    total = int(counted.sum())
    return {"accuracy": float((preds == labels)[counted].sum() / total) if total else 0.0}


def sft_metrics(config, tokenizer):
    if config.finetuning.compute_accuracy and not config.training.get("prediction_loss_only"):
        return token_accuracy, argmax_logits
    return None, None


class SFTTrainer(TunelineTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if getattr(self.finetuning_args, "use_dft_loss", False):
            from tuneline.losses import dft_loss

            self.compute_loss_func = dft_loss  # the Trainer hands it the outputs and the labels it set aside

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if return_outputs or not self.projects_label_positions_only:  # evaluation keeps every position's logits
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        import torch

        next_labels = inputs["labels"][:, 1:]
        counted = next_labels != IGNORE_INDEX
        inputs = {**inputs, "logits_to_keep": torch.nn.functional.pad(counted, (0, 1), value=False),
                  "shift_labels": next_labels[counted]}
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    @functools.cached_property
    def projects_label_positions_only(self) -> bool:
        """Where the model's forward takes a `logits_to_keep` mask and the loss is the model's own."""
        no_own_loss = self.label_smoother is None and self.compute_loss_func is None
        return no_own_loss and projects_selected_positions(self.model)


SPEC = StageSpec(name="sft", trainer_class=SFTTrainer, metrics=sft_metrics, after_train=predict_with_generate,
                 perplexity=True)


run = functools.partial(run_stage, spec=SPEC)  # the stage interface: run(config, dataset_ref, extra_callbacks)
