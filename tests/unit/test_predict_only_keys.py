"""A run that only predicts (`do_predict` without `do_train`) refuses the keys only training reads, in one message,
and keeps every key LLaMA-Factory's nlg_eval example sets (the model to load, the data, generation, evaluation)."""

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from tuneline.config import dump_config, load_config
from tuneline.config.args import DataArgs, GeneratingArgs
from tuneline.config.loader import ALL_KEYS
from tuneline.config.scope import TRAINING_ONLY
from tuneline.errors import ConfigError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "llamafactory"
NLG_EVAL = FIXTURES / "0.9.5" / "examples" / "extras" / "nlg_eval" / "llama3_lora_predict.yaml"
# What `tuneline predict` adds to a config (flows.finetune.PREDICT_OVERRIDES), and a held-out set to answer.
PREDICT = ["do_predict=true", "predict_with_generate=true", "do_train=false", "eval_dataset=identity"]
REFUSAL = re.compile(r"'do_predict: true' without 'do_train' trains nothing, and these keys are read only by "
                     r"training, so they would change nothing: (.*); remove them, or set 'do_train: true' to train "
                     r"first")


def refusal(path, overrides) -> tuple[list[str], str]:
    """(the keys named by the one problem the config is refused with, that problem)."""
    with pytest.raises(ConfigError) as caught:
        load_config(path, overrides, check_paths=False)
    [message] = caught.value.problems
    [named] = REFUSAL.fullmatch(message).groups()
    return re.findall(r"'(\w+): ", named), message


def test_the_nlg_eval_example_predicts_with_every_key_it_sets():
    config = load_config(NLG_EVAL, check_paths=False)
    assert config.predict_only and config.finetuning.finetuning_type == "lora"
    assert config.training["per_device_eval_batch_size"] == 1 and config.training["ddp_timeout"] == 180000000


def test_a_training_config_asked_to_predict_names_each_training_key_it_sets_once(tmp_path):
    """LLaMA-Factory's sft example through `tuneline predict`: the keys it sets to something other than their
    default that only training reads are named in one message; its model, data, precision (bf16) and launch
    (ddp_timeout) keys are not."""
    sft = FIXTURES / "llama3_lora_sft.yaml"
    named, message = refusal(sft, PREDICT)
    assert sorted(named) == ["dataloader_num_workers", "gradient_accumulation_steps", "learning_rate",
                             "lr_scheduler_type", "num_train_epochs", "per_device_train_batch_size", "plot_loss",
                             "save_steps", "warmup_ratio"]
    # not named: lora_rank: 8, lora_target: all, logging_steps: 10 and save_only_model: false, which are the defaults


def test_the_keys_other_checks_would_refuse_one_by_one_are_named_in_the_same_message():
    """Keys of other stages, optimizers and methods: named once, in the one message, not each by its own check."""
    extra = ["lora_rank=16", "use_badam=true", "pref_beta=0.2", "num_generations=4",
             "loraplus_lr_ratio=4", "resume_from_checkpoint=saves/x/checkpoint-10", "eval_max_samples=8"]
    named, message = refusal(NLG_EVAL, extra)
    assert sorted(named) == ["eval_max_samples", "lora_rank", "loraplus_lr_ratio", "num_generations", "pref_beta",
                             "resume_from_checkpoint", "use_badam"]
    assert message.count("lora_rank") == 1, "scope's, badam's and grpo's own checks say nothing more"


def test_a_secret_among_them_is_named_but_never_shown():
    named, message = refusal(NLG_EVAL, ["push_to_hub=true", "hub_token=hf_secret_value"])
    assert sorted(named) == ["hub_token", "push_to_hub"] and "hf_secret_value" not in message


def test_defaults_are_never_refused_and_a_run_that_trains_then_predicts_keeps_them_all(tmp_path):
    config = load_config(NLG_EVAL, check_paths=False)
    resolved = dump_config(config, tmp_path / "resolved.yaml")  # every key written out, at its default
    assert load_config(resolved, check_paths=False).predict_only
    both = load_config(FIXTURES / "llama3_lora_sft.yaml", [*PREDICT, "do_train=true"], check_paths=False)
    assert not both.predict_only and both.training["learning_rate"] == 1.0e-4


def test_the_training_only_keys_are_real_keys_and_none_is_read_by_the_predict_step():
    from tuneline.identity.config_keys import PREDICT_KEYS
    from tuneline.model.fingerprint import LOAD_KEYS

    assert TRAINING_ONLY <= ALL_KEYS
    read = {*PREDICT_KEYS, *LOAD_KEYS, *yaml.safe_load(NLG_EVAL.read_text()), "adapter_name_or_path",
            "bf16", "fp16", "use_cpu", "infer_dtype", "seed", "data_seed", "output_dir", "do_predict",
            *(f.name for group in (DataArgs, GeneratingArgs) for f in dataclasses.fields(group))}
    assert not TRAINING_ONLY & read
