"""Gradient checkpointing keys: LLaMA-Factory's and transformers' switches resolve to one setting, contradictions
are refused, and the setting stays out of the train step's key (it recomputes the same numbers)."""

from __future__ import annotations

import pytest

from tuneline.config import dump_config, load_config
from tuneline.errors import ConfigError


def config(tmp_path, **keys):
    return load_config(None, {"model_name_or_path": "org/model", "dataset": "x", "output_dir": str(tmp_path / "o"),
                              **keys}, check_paths=False)


@pytest.mark.parametrize(("keys", "off"), [
    ({}, False),
    ({"gradient_checkpointing": True}, False),
    ({"activation_checkpointing": True, "gradient_checkpointing": True}, False),
    ({"disable_gradient_checkpointing": True}, True),
    ({"gradient_checkpointing": False}, True),
    ({"activation_checkpointing": False}, True),
    ({"disable_gradient_checkpointing": True, "gradient_checkpointing": False}, True),
])
def test_one_rule_for_every_switch(tmp_path, keys, off):
    resolved = config(tmp_path, **keys)
    assert resolved.model.disable_gradient_checkpointing is off
    assert not {"gradient_checkpointing", "activation_checkpointing"} & set(resolved.training)  # the Trainer's own
    reread = load_config(dump_config(resolved, tmp_path / "resolved.yaml"), check_paths=False)
    assert reread.model.disable_gradient_checkpointing is off


@pytest.mark.parametrize(("keys", "message"), [
    ({"disable_gradient_checkpointing": True, "gradient_checkpointing": True},
     "'disable_gradient_checkpointing: true' and 'gradient_checkpointing: true' contradict each other"),
    ({"disable_gradient_checkpointing": True, "activation_checkpointing": True},
     "'disable_gradient_checkpointing: true' and 'activation_checkpointing: true' contradict each other"),
    ({"gradient_checkpointing": True, "activation_checkpointing": False},
     "'gradient_checkpointing: true' and 'activation_checkpointing: false' disagree"),
    ({"gradient_checkpointing_kwargs": {"use_reentrant": False}, "activation_checkpointing_kwargs": {}},
     "'gradient_checkpointing_kwargs' and 'activation_checkpointing_kwargs' are both set"),
    ({"gradient_checkpointing_kwargs": {"use_reentrant": False}, "disable_gradient_checkpointing": True},
     "'gradient_checkpointing_kwargs' configures gradient checkpointing, which this config turns off"),
    ({"use_reentrant_gc": False, "activation_checkpointing_kwargs": {"use_reentrant": True}},
     "'use_reentrant_gc: false' and 'activation_checkpointing_kwargs: {use_reentrant: true}' contradict"),
    ({"gradient_checkpointing_kwargs": "use_reentrant"}, "'gradient_checkpointing_kwargs' is 'use_reentrant'; it "
                                                         "must be a mapping"),
])
def test_contradictions_are_refused_with_the_keys_named(tmp_path, keys, message):
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
        config(tmp_path, **keys)


def test_checkpointing_leaves_the_train_key_alone(tmp_path):
    from tuneline.identity.keys import training_slice

    default = training_slice(config(tmp_path))
    for keys in ({"disable_gradient_checkpointing": True}, {"gradient_checkpointing": False},
                 {"use_reentrant_gc": False}):
        assert training_slice(config(tmp_path, **keys)) == default
    assert training_slice(config(tmp_path, lora_rank=4)) != default
