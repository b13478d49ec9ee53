"""Several torch optimizers trained as one: what the Trainer (scheduler, checkpoints, clipping) needs from an
optimizer, over Muon + AdamW (use_muon) and over the per-parameter optimizers of layerwise GaLore / APOLLO.

Its param_groups are the inner optimizers' own group dicts, so the Trainer's scheduler sets their learning rates;
its state_dict holds each inner optimizer's, in order, so a resumed run continues exactly."""

from __future__ import annotations

import torch

from tuneline.errors import UserError


class OptimizerSet(torch.optim.Optimizer):
    def __init__(self, optimizers: list):
        self.optimizers = list(optimizers)
        super().__init__([torch.zeros(1)], {"lr": 0.0})  # torch's bookkeeping; replaced by the inner groups below
        self.param_groups = [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for optimizer in self.optimizers:
            optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [optimizer.state_dict() for optimizer in self.optimizers]}

    def load_state_dict(self, state_dict: dict) -> None:
        saved = state_dict.get("optimizers", [])
        if len(saved) != len(self.optimizers):
            raise UserError(f"the checkpoint's optimizer state holds {len(saved)} optimizers and this run builds "
                            f"{len(self.optimizers)}: it was saved with other trainable parameters or optimizer keys; "
                            "resume with the config it was saved with")
        for optimizer, state in zip(self.optimizers, saved, strict=True):
            optimizer.load_state_dict(state)
