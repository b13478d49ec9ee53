"""`stage: dpo` -- pairwise preference tuning: sigmoid (DPO), hinge, ipo, orpo, simpo.

Run through the flow (`tuneline train examples/dpo_lora_demo.yaml`) or alone in a training process
(`accelerate launch -m tuneline.train <config>`), which calls `run` below.

Why our own `Trainer` subclass rather than trl's `DPOTrainer`: trl 1.16 tokenizes prompts itself
(`prompt_ids`/`chosen_ids` columns), has no ORPO or SimPO loss, and precomputes reference log-probs inside
its constructor keyed by an in-memory hash. Our data arrives already tokenized with labels masking the
prompt, and reference log-probs come from the cached `build-reference-model` step; the losses are the pure
functions in `tuneline.objectives.losses`. What remains here is a forward pass and metric bookkeeping.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from typing import Any

from tuneline.errors import UserError
from tuneline.objectives.logps import pair_logps
from tuneline.objectives.losses import LENGTH_NORMALISED, REFERENCE_FREE, pairwise_loss
from tuneline.train.trainer_base import StageSpec, TunelineTrainer, run_stage

REF_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")


class PreferenceTrainer(TunelineTrainer):
    """What DPO and KTO share: a reference (precomputed, a frozen model, or the policy without its adapter)
    and `rewards/*`-style metrics averaged over each logging window, `eval_`-prefixed for evaluation."""

    ref_columns: tuple[str, ...] = ()
    counts_pair_tokens = True

    def __init__(self, *args, ref_model=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.finetuning = self.finetuning_args
        self.data_collator = WithReferenceColumns(self.data_collator, self.ref_columns)
        self.ref_model = ref_model
        if ref_model is not None:
            self.ref_model = ref_model.to(self.args.device).eval().requires_grad_(False)
        # Our losses are per-example means, not token sums: the Trainer must divide by accumulation steps.
        self.model_accepts_loss_kwargs = False
        self.loss_is_scaled_for_ga = False
        self._stored: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}

    @property
    def pad_token_id(self) -> int:
        pad = getattr(self.processing_class, "pad_token_id", None)
        return 0 if pad is None else int(pad)

    def with_reference(self, model, compute):
        """`compute(reference_model)` without gradients: the frozen copy, or the policy with adapters off."""
        import torch

        if self.ref_model is not None:
            reference, context = self.ref_model, nullcontext()
        else:
            unwrapped = self.accelerator.unwrap_model(model)
            if not hasattr(unwrapped, "disable_adapter"):
                raise RuntimeError("no reference: the dataset has no ref_* columns, no ref_model was loaded, "
                                   "and the policy has no adapter to disable")
            reference, context = model, unwrapped.disable_adapter()
        with torch.no_grad(), context:
            return compute(reference)

    def stored_reference(self, inputs) -> tuple | None:
        """The batch's precomputed reference columns, or None when its rows carry none.

        The reference step leaves NaN in the rows it expects the run never to visit (tuneline.reference.rows); the
        check is made here, where the numbers are used, because the dataloader collates a batch ahead of the step
        that trains on it."""
        if self.ref_columns[0] not in inputs:
            return None
        values = tuple(inputs[name] for name in self.ref_columns)
        for name, value in zip(self.ref_columns, values, strict=True):
            if value.isnan().any():
                raise UserError(MISSING_REFERENCE.format(rows=int(value.isnan().sum()), column=name))
        return values

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mode = "train" if model.training else "eval"
        loss, metrics = self.batch_loss(model, inputs)
        for name, value in metrics.items():
            self._stored[mode][name].append(float(value))
        return (loss, metrics) if return_outputs else loss

    def batch_loss(self, model, inputs) -> tuple[Any, dict[str, float]]:
        raise NotImplementedError

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        import torch

        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "eval" if any(key.startswith("eval_") for key in logs) else "train"
        stored = self._stored[mode]
        if stored:
            import torch

            names = sorted(stored)
            means = torch.tensor([sum(stored[n]) / len(stored[n]) for n in names], device=self.args.device)
            means = self.accelerator.reduce(means, "mean").tolist()
            prefix = "eval_" if mode == "eval" else ""
            logs.update({prefix + name: value for name, value in zip(names, means, strict=True)})
            stored.clear()
        super().log(logs, start_time)


def reward_metrics(out, chosen_logps, rejected_logps) -> dict[str, float]:
    """The metrics every preference stage logs, from a `PreferenceLoss` and the policy's log-probs."""
    metrics = {}
    if out.chosen_rewards.numel():
        metrics["rewards/chosen"] = out.chosen_rewards.mean().item()
        metrics["logps/chosen"] = chosen_logps.detach().mean().item()
    if out.rejected_rewards.numel():
        metrics["rewards/rejected"] = out.rejected_rewards.mean().item()
        metrics["logps/rejected"] = rejected_logps.detach().mean().item()
    for name, value in out.parts.items():
        metrics[name] = value.float().mean().item()
    return metrics


class DPOTrainer(PreferenceTrainer):
    """Pairwise losses from `tuneline.objectives.losses`, plus `pref_ftx` times the chosen side's mean NLL."""

    ref_columns = REF_COLUMNS

    def batch_loss(self, model, inputs):
        ft = self.finetuning
        # the reference first: its forward's logits are gone before the policy's are kept for backward
        ref_chosen, ref_rejected = self.reference_logps(model, inputs)
        chosen, rejected, chosen_len, rejected_len = pair_logps(model, inputs, self.pad_token_id)
        chosen_len, rejected_len = chosen_len.clamp(min=1), rejected_len.clamp(min=1)
        if ft.pref_loss in LENGTH_NORMALISED:
            chosen, rejected = chosen / chosen_len, rejected / rejected_len
            if ref_chosen is not None:
                ref_chosen, ref_rejected = ref_chosen / chosen_len, ref_rejected / rejected_len
        out = pairwise_loss(ft.pref_loss, chosen, rejected, ref_chosen, ref_rejected, beta=ft.pref_beta,
                            label_smoothing=ft.dpo_label_smoothing, simpo_gamma=ft.simpo_gamma)
        losses = out.losses
        if ft.pref_ftx > 0:
            chosen_mean = chosen if ft.pref_loss in LENGTH_NORMALISED else chosen / chosen_len
            losses = losses - ft.pref_ftx * chosen_mean
        metrics = reward_metrics(out, chosen, rejected)
        metrics["rewards/accuracies"] = (out.chosen_rewards > out.rejected_rewards).float().mean().item()
        metrics["rewards/margins"] = (out.chosen_rewards - out.rejected_rewards).mean().item()
        return losses.mean(), metrics

    def reference_logps(self, model, inputs):
        """Summed reference log-probs: precomputed columns when present, else a live forward; None if unused."""
        if self.finetuning.pref_loss in REFERENCE_FREE:
            return None, None
        if (stored := self.stored_reference(inputs)) is not None:
            return stored
        chosen, rejected, _, _ = self.with_reference(model, lambda ref: pair_logps(ref, inputs, self.pad_token_id))
        return chosen, rejected


class WithReferenceColumns:
    """Wraps a data collator: float `ref_*` columns become tensors; everything else goes to the collator."""

    def __init__(self, collator, names: tuple[str, ...]):
        self.collator, self.names = collator, names

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        present = [name for name in self.names if name in features[0]]
        rest = [{k: v for k, v in f.items() if k not in present} for f in features]
        batch = self.collator(rest)
        for name in present:
            batch[name] = torch.tensor([f[name] for f in features], dtype=torch.float32)
        return batch


MISSING_REFERENCE = (
    "{rows} row(s) of a batch have no precomputed '{column}': the build-reference-model step computed reference "
    "log-probs only for the rows a run of this config visits, and this run visits others (was the dataset made for "
    "another max_steps, batch size, seed or process count?). Run the flow again (`tuneline train CONFIG`) so the "
    "step adds the missing rows, or set 'precompute_ref: false' to run the reference live")


def preference_stage(name: str, trainer_class) -> Callable[..., dict]:
    """The stage's `run` (run_stage with its spec bound), with a live reference model loaded only when the data
    carries no ref_* columns and the policy's own disabled adapter cannot serve (full/freeze tuning, or an explicit
    ref_model)."""

    def live_reference(config, datasets, tokenizer) -> dict:
        from tuneline.reference import load_reference_model, uses_reference

        needed = uses_reference(config) and not has_columns(datasets, trainer_class.ref_columns)
        return {"ref_model": load_reference_model(config, tokenizer) if needed else None}

    return partial(run_stage, spec=StageSpec(name=name, trainer_class=trainer_class, trainer_kwargs=live_reference))


def has_columns(datasets, names: tuple[str, ...]) -> bool:
    """True when every non-empty split holds all the named columns."""
    splits = [ds for ds in datasets.values() if len(ds)]
    return bool(splits) and all(set(names) <= set(ds.column_names) for ds in splits)


run = preference_stage("dpo", DPOTrainer)  # the stage interface: run(config, dataset_ref, extra_callbacks)
