"""Gradient (activation) checkpointing: on for every training stage, as in LLaMA-Factory, unless turned off.

LLaMA-Factory checkpoints by default, so a config moved over must not need more GPU memory here. transformers'
own `gradient_checkpointing` (`activation_checkpointing` in transformers 5) is folded into one resolved
`disable_gradient_checkpointing`, and `tuneline.model` (not the Trainer) enables it, so the Trainer stages and PPO's
loop agree and a model without support is skipped with a warning. Keys that disagree are refused."""

from __future__ import annotations

from tuneline.config.run_config import RunConfig

SWITCHES = ("gradient_checkpointing", "activation_checkpointing")  # transformers' names, old and new
KWARGS = ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs")
# Where they go instead of torch's checkpoint function (transformers' `activation_checkpointing_enable` arguments).
LAYOUT_KWARGS = ("every_n_layers", "offload")


def resolve_checkpointing(config: RunConfig) -> list[str]:
    """Fold transformers' switches into `disable_gradient_checkpointing`; problems where keys disagree."""
    tr, margs = config.training, config.model
    given = {key: tr.pop(key) for key in SWITCHES if key in tr}
    given = {key: value for key, value in given.items() if value is not None}
    problems = []
    if len(set(given.values())) > 1:
        old, new = (str(given[key]).lower() for key in SWITCHES)
        problems.append(f"'gradient_checkpointing: {old}' and 'activation_checkpointing: {new}' disagree "
                        "(transformers 5 renamed the first to the second); keep one")
    turned_on = [key for key, value in given.items() if value]
    if margs.disable_gradient_checkpointing and turned_on:
        problems.append(f"'disable_gradient_checkpointing: true' and '{turned_on[0]}: true' contradict each other; "
                        "remove one (checkpointing is on by default, as in LLaMA-Factory)")
    if any(value is False for value in given.values()):
        margs.disable_gradient_checkpointing = True
    return problems + _kwargs_problems(config)


def _kwargs_problems(config: RunConfig) -> list[str]:
    tr, margs = config.training, config.model
    named = [key for key in KWARGS if tr.get(key) is not None]
    if len(named) > 1:
        return [f"'{KWARGS[0]}' and '{KWARGS[1]}' are both set (transformers 5 renamed the first to the second); "
                "keep one"]
    if not named:
        return []
    key, value = named[0], tr[named[0]]
    if not isinstance(value, dict):
        return [f"'{key}' is {value!r}; it must be a mapping, e.g. {{use_reentrant: false}}"]
    if margs.disable_gradient_checkpointing:
        return [f"'{key}' configures gradient checkpointing, which this config turns off; remove it, or remove "
                "'disable_gradient_checkpointing' / 'gradient_checkpointing: false'"]
    if value.get("use_reentrant") is True and not margs.use_reentrant_gc:
        return [f"'use_reentrant_gc: false' and '{key}: {{use_reentrant: true}}' contradict each other; keep one"]
    return []


def checkpointing_kwargs(config: RunConfig) -> tuple[dict, dict]:
    """(torch checkpoint kwargs, layout kwargs): `use_reentrant` from `use_reentrant_gc` unless the kwargs key
    names it, then the rest of `*_checkpointing_kwargs`."""
    tr = config.training
    given = dict(next((tr[key] for key in KWARGS if tr.get(key) is not None), {}))
    layout = {key: given.pop(key) for key in LAYOUT_KWARGS if key in given}
    return {"use_reentrant": config.model.use_reentrant_gc, **given}, layout
