"""A ppo or grpo run whose `reward_model_config` trains its reward model first: where that run leaves it, as
overrides."""

from __future__ import annotations


def reward_model_overrides(reward_model_config: str, reward_output_dir: str, config=None) -> list[str]:
    """Point a ppo run at the reward model its `reward_model_config` run trained into `reward_output_dir`; a grpo
    `config` gets it as one more `reward_funcs` item."""
    import json

    from tuneline.config import load_config

    if config is not None and config.stage in ("grpo", "rloo"):
        items = [*(config.grpo.reward_funcs or []), reward_output_dir]
        return [f"reward_funcs={json.dumps(items)}", "reward_model_config=null"]

    trained_as = load_config(reward_model_config, check_paths=False).finetuning.finetuning_type
    return [f"reward_model={reward_output_dir}", f"reward_model_type={'lora' if trained_as == 'lora' else 'full'}",
            "reward_model_config=null"]
