"""Small library steps the orchestration needs beyond data, training and evaluation themselves."""

from __future__ import annotations

from pathlib import Path

from tuneline.config import RunConfig
from tuneline.pipeline import keys
from tuneline.step_cache import entry_dir, is_complete


def inspect_tokenizer(config: RunConfig) -> dict:
    """Load the tokenizer once to prove it works; later steps receive this reference, not the object."""
    from tuneline.model import load_tokenizer

    tokenizer = load_tokenizer(config.model)
    return {
        "path": str(config.model.model_name_or_path),
        "fingerprint": keys.tokenizer_key(config),
        "vocab_size": len(tokenizer),
        "has_chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
    }


def dataset_complete(config: RunConfig, key: str) -> bool:
    from tuneline.data.build import usable_entry

    location = config.data.tokenized_path or entry_dir(config.pipeline.pipeline_cache_dir, "build-dataset", key)
    return usable_entry(location)  # a damaged entry is set aside here, so Prefect's record is not trusted


def reference_complete(config: RunConfig, key: str) -> bool:
    from tuneline.reference import needs_reference

    if not needs_reference(config):
        return True
    return is_complete(entry_dir(config.pipeline.pipeline_cache_dir, "build-reference-model", key))


def make_plots(config: RunConfig, trained: dict) -> list[str]:
    from tuneline.report import plot_curves

    output_dir = Path(trained["output_dir"])
    return plot_curves(output_dir / "trainer_log.jsonl", output_dir)


def make_model_card(config: RunConfig, trained: dict, base_eval: dict, tuned_eval: dict, plots: list[str],
                    dataset: dict, run: dict) -> str:
    from tuneline.evaluation import not_evaluated
    from tuneline.pipeline.record import run_link
    from tuneline.report import write_model_card

    return write_model_card(
        config, trained["output_dir"],
        base_metrics=base_eval.get("metrics", {}), tuned_metrics=tuned_eval.get("metrics", {}),
        not_evaluated=not_evaluated(tuned_eval, base_eval),
        dataset_fingerprints={name: dataset["fingerprint"] for name in config.dataset_names},
        plots=plots, mlflow_run=run_link(run),
    )


def reward_model_overrides(reward_model_config: str, reward_output_dir: str) -> list[str]:
    """Point a ppo run at the reward model its `reward_model_config` run trained into `reward_output_dir`."""
    from tuneline.config import load_config

    trained_as = load_config(reward_model_config, check_paths=False).finetuning.finetuning_type
    return [f"reward_model={reward_output_dir}", f"reward_model_type={'lora' if trained_as == 'lora' else 'full'}",
            "reward_model_config=null"]
