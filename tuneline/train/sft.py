"""Supervised fine-tuning: causal LM loss over response tokens only (labels -100 never count), or Dynamic
Fine-Tuning's probability-weighted one (`use_dft_loss`), the entropy-weighted EAFT (`use_eaft_loss`) or DFT anchored
to the model before training by a KL term (`use_asft_loss`, against a frozen copy), token accuracy when `compute_accuracy`, and generated
answers scored by ROUGE/BLEU when `predict_with_generate`.

A training step projects onto the vocabulary only the positions whose next token is a label (transformers'
`logits_to_keep` mask and `shift_labels`): prompt and padding positions would be projected, then ignored by the
loss. Same loss and gradients, less of the step's largest matmul and of its largest tensor (logits by vocabulary).

Run: `python -m tuneline.train examples/sft_lora.yaml` (or through `accelerate launch`).
"""

from __future__ import annotations

import functools

from tuneline.objectives.logps import projects_selected_positions
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
        from tuneline.objectives import losses

        ft, self.asft_reference = self.finetuning_args, None
        if getattr(ft, "use_dft_loss", False):
            self.compute_loss_func = losses.dft_loss  # the Trainer hands it the outputs and the labels it set aside
        elif getattr(ft, "use_eaft_loss", False):
            self.compute_loss_func = functools.partial(losses.eaft_loss, alpha=ft.eaft_alpha)
        elif getattr(ft, "use_asft_loss", False):
            self.asft_reference = frozen_copy(self.model)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.asft_reference is not None:  # evaluated with it too, as LLaMA-Factory does
            return self.anchored_loss(model, inputs, return_outputs)
        if return_outputs or not self.projects_label_positions_only:  # evaluation keeps every position's logits
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        import torch

        next_labels = inputs["labels"][:, 1:]
        counted = next_labels != IGNORE_INDEX
        inputs = {**inputs, "logits_to_keep": torch.nn.functional.pad(counted, (0, 1), value=False),
                  "shift_labels": next_labels[counted]}
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def anchored_loss(self, model, inputs, return_outputs=False):
        """ASFT: the model's and the frozen copy's logits on the same batch, into `asft_loss`."""
        import torch

        from tuneline.objectives.losses import asft_loss

        model_inputs = {key: value for key, value in inputs.items() if key != "labels"}
        with torch.no_grad():
            reference_logits = self.asft_reference(**model_inputs).logits
        outputs = model(**model_inputs)
        loss = asft_loss(outputs, inputs["labels"], reference_logits, alpha=self.finetuning_args.asft_alpha)
        return (loss, outputs) if return_outputs else loss

    @functools.cached_property
    def projects_label_positions_only(self) -> bool:
        """Where the model's forward takes a `logits_to_keep` mask and the loss is the model's own (liger's fused
        linear cross-entropy, when on, makes no logits at all: it is left to that)."""
        no_own_loss = self.label_smoother is None and self.compute_loss_func is None and not self.args.use_liger_kernel
        return no_own_loss and projects_selected_positions(self.model)


def frozen_copy(model):
    """The model as it is before training (base weights and any adapter loaded), in eval mode, without gradients:
    ASFT's reference, as LLaMA-Factory loads a second copy of the starting model."""
    import copy

    reference = copy.deepcopy(model).eval()
    for param in reference.parameters():
        param.requires_grad_(False)
    return reference


SPEC = StageSpec(name="sft", trainer_class=SFTTrainer, metrics=sft_metrics, after_train=predict_with_generate,
                 perplexity=True)


run = functools.partial(run_stage, spec=SPEC)  # the stage interface: run(config, dataset_ref, extra_callbacks)
