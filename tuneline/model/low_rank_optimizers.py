"""GaLore and APOLLO as LLaMA-Factory configures them (use_galore / use_apollo and their galore_* / apollo_* keys),
built by transformers' own galore_* / apollo_* optimizers, and their layerwise variants with a state that
checkpoints.

transformers chooses the optimizer class and splits the target Linear weights into their group; tuneline then
gives the other parameters LLaMA-Factory's two weight-decay groups. Layerwise, each parameter has an optimizer of
its own, stepped from a gradient hook as soon as its gradient is ready; transformers' LayerWiseDummyOptimizer saves
none of their state and its per-parameter schedulers restart on resume, so `LayerwiseOptimizer` (an OptimizerSet)
holds them instead, under the Trainer's one scheduler and in its checkpoints."""

from __future__ import annotations

import copy

import torch

from tuneline.config.optimizer_keys import low_rank_optim_name
from tuneline.config.run_config import split_names
from tuneline.errors import ConfigError, UserError
from tuneline.model.optimizer_set import OptimizerSet

PACKAGES = {"galore": ("galore_torch", "galore"), "apollo": ("apollo_torch", "apollo")}


def low_rank_method(finetuning_args) -> str | None:
    return "galore" if finetuning_args.use_galore else "apollo" if finetuning_args.use_apollo else None


def _optim_args(method: str, ft) -> str:
    if method == "galore":
        values = {"rank": ft.galore_rank, "update_proj_gap": ft.galore_update_interval, "scale": ft.galore_scale,
                  "proj_type": ft.galore_proj_type}
    else:
        values = {"rank": ft.apollo_rank, "update_proj_gap": ft.apollo_update_interval, "scale": ft.apollo_scale,
                  "proj_type": ft.apollo_proj_type, "proj": ft.apollo_proj, "scale_type": ft.apollo_scale_type}
    return ",".join(f"{key}={value}" for key, value in values.items())


def target_modules(model, method: str, ft) -> list[str]:
    """Module names the method projects: 'all' is every Linear layer but the output layers (LLaMA-Factory's
    `find_all_linear_modules`); named ones must be modules of this model."""
    from tuneline.model.adapters import linear_module_names

    key = f"{method}_target"
    names = split_names(getattr(ft, key))
    if names == ["all"]:
        return sorted(linear_module_names(model))
    module_names = [name for name, _ in model.named_modules()]
    unknown = [n for n in names if not any(n in module for module in module_names)]
    if unknown:
        raise ConfigError(f"'{key}' names {', '.join(repr(n) for n in unknown)}, which is part of no module name of "
                          f"this {model.config.model_type} model; Linear layers: "
                          f"{', '.join(sorted(linear_module_names(model)))}")
    return names


def _require(method: str) -> None:
    from tuneline.runtime.requirements import installed

    module, extra = PACKAGES[method]
    if not installed(module):
        raise UserError(f"'use_{method}: true' needs the {module.replace('_', '-')} package: "
                        f"`pip install -e '.[{extra}]'`")
    _allow_projector_checkpoints(method)


def _allow_projector_checkpoints(method: str) -> None:
    """The optimizers keep their projection (a small object of numbers and one matrix) in their state, which the
    Trainer loads back with torch.load(weights_only=True): allow those classes, as torch's API for it says."""
    if method == "galore":
        from galore_torch.galore_projector import GaLoreProjector

        torch.serialization.add_safe_globals([GaLoreProjector])
    else:
        from apollo_torch.random_projector import GradientProjector
        from apollo_torch.svd_projector import GaLoreProjector

        torch.serialization.add_safe_globals([GradientProjector, GaLoreProjector])


def create_low_rank_optimizer(model, training_args, finetuning_args):
    """GaLore or APOLLO over the trainable parameters: target Linear weights in the low-rank group with weight decay,
    the others in decay / no-decay groups; layerwise, one optimizer per parameter stepped by its gradient hook."""
    from transformers import Trainer

    from tuneline.model.optimizers import decay_groups

    method = low_rank_method(finetuning_args)
    _require(method)
    layerwise = getattr(finetuning_args, f"{method}_layerwise")
    args = copy.copy(training_args)
    args.optim = low_rank_optim_name(method, training_args.optim)
    args.optim_target_modules = target_modules(model, method, finetuning_args)
    args.optim_args = _optim_args(method, finetuning_args)
    optim_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    _, low_rank_group = kwargs.pop("params")
    targets = {id(p) for p in low_rank_group["params"] if p.requires_grad}
    low_rank_group = {**low_rank_group, "params": [p for p in low_rank_group["params"] if p.requires_grad],
                      "weight_decay": training_args.weight_decay}
    if method == "apollo":
        low_rank_group["scale_front"] = finetuning_args.apollo_scale_front
    others = [{**group, "params": [p for p in group["params"] if id(p) not in targets]}
              for group in decay_groups(model, training_args.weight_decay)]
    groups = [group for group in others if group["params"]] + [low_rank_group]
    if not layerwise:
        return optim_cls(groups, **kwargs)
    return LayerwiseOptimizer({param: optim_cls([{**group, "params": [param]}], **kwargs)
                               for group in groups for param in group["params"]})


class LayerwiseOptimizer(OptimizerSet):
    """One optimizer per parameter, each stepped as soon as its parameter's gradient is accumulated, so no
    whole-model gradient is ever held; `step` and `zero_grad` have nothing left to do."""

    def __init__(self, optimizer_dict: dict):
        super().__init__(list(optimizer_dict.values()))
        self.optimizer_dict = optimizer_dict
        for param in optimizer_dict:
            param.register_post_accumulate_grad_hook(self._step_parameter)

    def _step_parameter(self, param) -> None:
        if param.grad is not None:
            self.optimizer_dict[param].step()
            self.optimizer_dict[param].zero_grad(set_to_none=True)

    def step(self, closure=None):
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None
