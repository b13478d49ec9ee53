"""`stage: kto` -- preference tuning from single completions marked desirable or undesirable (`kto_tag`).

Run through the flow (`tuneline train examples/kto_lora_demo.yaml`) or in a training process
(`accelerate launch -m tuneline.train <config>`), which calls `run` below (tuneline.train.trainer_base.run_stage).

Each row carries its own completion and a mismatched one (the `kl_*` columns, another row's completion after
this row's prompt); the mismatched pairs estimate the KL baseline of the KTO loss. Reference log-probs of both
come precomputed (`ref_logps`, `ref_kl_logps`) or from a live reference, exactly as in the dpo stage.
"""

from __future__ import annotations

from tuneline.objectives.logps import completion_logps
from tuneline.objectives.losses import kto_loss
from tuneline.train.dpo import PreferenceTrainer, preference_stage, reward_metrics

REF_COLUMNS = ("ref_logps", "ref_kl_logps")


class KTOTrainer(PreferenceTrainer):
    """KTO loss from `tuneline.objectives.losses.kto_loss`, plus `pref_ftx` times the desirable rows' mean NLL."""

    ref_columns = REF_COLUMNS

    def batch_loss(self, model, inputs):
        import torch

        ft = self.finetuning
        # the forwards without gradients first: their logits are gone before the policy's are kept for backward
        ref_logps, ref_kl_logps = self.reference_logps(model, inputs)
        with torch.no_grad():  # the KL baseline is detached: no graph needed for it
            kl_logps, _ = completion_logps(model, inputs, "kl_")
        logps, lengths = completion_logps(model, inputs)
        desirable = inputs["kto_tags"].bool()
        out = kto_loss(logps[desirable], logps[~desirable], kl_logps, ref_logps[desirable], ref_logps[~desirable],
                       ref_kl_logps, beta=ft.pref_beta, chosen_weight=ft.kto_chosen_weight,
                       rejected_weight=ft.kto_rejected_weight)
        loss = out.losses.mean()
        if ft.pref_ftx > 0 and desirable.any():
            mean_logps = logps / lengths.clamp(min=1)
            loss = loss - ft.pref_ftx * mean_logps[desirable].sum() / len(desirable)
        metrics = reward_metrics(out, logps[desirable], logps[~desirable])
        # A row counts as right when its implied reward has the sign its tag asks for.
        right = torch.cat((out.chosen_rewards > 0, out.rejected_rewards < 0))
        metrics["rewards/accuracies"] = right.float().mean().item()
        if out.chosen_rewards.numel() and out.rejected_rewards.numel():
            metrics["rewards/margins"] = (out.chosen_rewards.mean() - out.rejected_rewards.mean()).item()
        return loss, metrics

    def reference_logps(self, model, inputs):
        """Summed reference log-probs of the completions and of the mismatched KL completions."""
        if (stored := self.stored_reference(inputs)) is not None:
            return stored

        def compute(ref):
            return completion_logps(ref, inputs)[0], completion_logps(ref, inputs, "kl_")[0]

        return self.with_reference(model, compute)


run = preference_stage("kto", KTOTrainer)  # the stage interface: run(config, dataset_ref, extra_callbacks)
