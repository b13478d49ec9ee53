"""Config parsing: LLaMA-Factory keys, overrides, and one clear message for every kind of bad config."""

import re
from pathlib import Path

import pytest
import yaml

from cli.main import run as cli_run
from tuneline.config import dump_config, load_config, parse_overrides
from tuneline.errors import ConfigError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "llamafactory"


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def problems_of(tmp_path, text: str, overrides=None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text), overrides, check_paths=False)
    return str(caught.value)


BASE = "model_name_or_path: org/model\ndataset: demo_sft\n"


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.yaml")))
def test_llamafactory_yaml_parses_unchanged(name):
    config = load_config(FIXTURES / name, check_paths=False)
    raw = yaml.safe_load((FIXTURES / name).read_text())
    assert config.stage == raw["stage"]
    assert config.training["learning_rate"] == pytest.approx(float(raw["learning_rate"]))
    assert config.training["gradient_accumulation_steps"] == raw["gradient_accumulation_steps"]
    assert config.finetuning.lora_rank == raw["lora_rank"]
    assert config.finetuning.lora_alpha == 2 * raw["lora_rank"]  # LLaMA-Factory's default
    assert config.training["overwrite_output_dir"] is True


def test_values_typed_and_groups_filled(tmp_path):
    config = load_config(write(tmp_path, BASE + "learning_rate: 5e-5\ncutoff_len: 256\nbf16: true\n"),
                         check_paths=False)
    assert config.training["learning_rate"] == 5e-5  # PyYAML reads 5e-5 as a string
    assert config.data.cutoff_len == 256 and config.training["bf16"] is True
    assert config.model.model_name_or_path == "org/model"
    assert config.run_name == "sft-lora model demo_sft"


def test_overrides_typed_like_yaml(tmp_path):
    config = load_config(write(tmp_path, BASE), ["learning_rate=5e-5", "max_steps=20", "packing=true"],
                         check_paths=False)
    assert config.training["max_steps"] == 20 and config.data.packing is True
    assert parse_overrides(["a=1", "b=x,y", "c="]) == {"a": 1, "b": "x,y", "c": None}
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["nonsense"])


def test_unknown_key_suggests_closest(tmp_path):
    message = problems_of(tmp_path, BASE + "lora_rnak: 8\n")
    assert "unknown key 'lora_rnak'; did you mean 'lora_rank'?" in message


def test_wrong_type_and_value_name_key_and_allowed(tmp_path):
    message = problems_of(tmp_path, BASE + "cutoff_len: long\nstage: sf\nfinetuning_type: qlora\n")
    assert "'cutoff_len' is 'long'" in message and "integer" in message
    assert "'stage' is 'sf'; allowed values: pt, sft, rm, ppo, dpo, kto" in message
    assert "'finetuning_type' is 'qlora'" in message
    assert "3 problems" in message  # all reported at once


def test_contradictions_name_both_keys(tmp_path):
    message = problems_of(tmp_path, BASE + "fp16: true\nbf16: true\nstage: ppo\n")
    assert "'fp16' and 'bf16' are both true" in message
    assert "'stage: ppo' needs 'reward_model'" in message
    assert "uses no reference model" in problems_of(tmp_path, BASE + "stage: dpo\npref_loss: orpo\nref_model: x/y\n")
    assert "'ppo_target' is 0.0 and 'ppo_init_kl_coef' 0.05" in problems_of(tmp_path, BASE + "ppo_target: 0\n")


def test_missing_model_and_dataset_paths_named(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "dataset_info.json").write_text('{"demo_sft": {"file_name": "missing.json"}}')
    text = f"model_name_or_path: ./no/such/model\ndataset: demo_sft,demo_sfx\ndataset_dir: {data_dir}\n"
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    message = str(caught.value)
    assert "'./no/such/model' does not exist" in message
    assert f"file '{data_dir / 'missing.json'}' does not exist" in message
    assert "dataset 'demo_sfx' is not in" in message and "did you mean 'demo_sft'" in message


def test_unsupported_llamafactory_option_is_refused_only_when_on(tmp_path):
    load_config(write(tmp_path, BASE + "use_unsloth: false\n"), check_paths=False)
    assert "does not support" in problems_of(tmp_path, BASE + "use_unsloth: true\n")


def test_do_predict_alone_predicts_without_training(tmp_path):
    predict = "model_name_or_path: org/model\neval_dataset: demo_sft_eval\ndo_predict: true\npredict_with_generate: true\n"
    config = load_config(write(tmp_path, predict), check_paths=False)
    assert config.predict_only and config.training["do_train"] is False
    assert not load_config(write(tmp_path, BASE + "do_predict: true\npredict_with_generate: true\nval_size: 2\n"
                                         "do_train: true\n"), check_paths=False).predict_only
    message = problems_of(tmp_path, "model_name_or_path: org/model\ndo_predict: true\npredict_with_generate: true\n")
    assert "'do_predict: true' answers the prompts of a held-out set and there is none" in message
    assert "'dataset' is required" not in message


def test_dump_round_trips(tmp_path):
    config = load_config(write(tmp_path, BASE + "learning_rate: 3.0e-4\n"), check_paths=False)
    path = dump_config(config, tmp_path / "out" / "resolved.yaml")
    again = load_config(path, check_paths=False)
    assert again.flat() == config.flat()
    assert path.read_text().startswith("# resolved by tuneline")


def test_masked_hides_credentials_and_shows_settings_that_name_tokens(tmp_path):
    settings = {"max_new_tokens": 16, "eval_max_new_tokens": 8, "use_fast_tokenizer": False, "predict_with_generate": True,
                "skip_special_tokens": False, "ignore_pad_token_for_loss": True, "split_special_tokens": True}
    extra = "hf_hub_token: hf_secret\nhub_token: hf_other\npush_to_hub: true\n" + "".join(f"{k}: {v}\n" for k, v in settings.items())
    config = load_config(write(tmp_path, BASE + extra), check_paths=False)
    masked = config.masked()
    assert masked["hf_hub_token"] == masked["hub_token"] == "***" and config.flat()["hf_hub_token"] == "hf_secret"
    assert {key: masked[key] for key in settings} == settings
    unset = config.without_secrets().flat()  # what the run's logged config file holds
    assert unset["hf_hub_token"] is None and "hub_token" not in unset and unset["max_new_tokens"] == 16


def test_cli_exits_2_with_one_message(tmp_path, capsys):
    path = write(tmp_path, BASE + "lora_rnak: 8\n")
    assert cli_run(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid config") and "Traceback" not in err
    assert cli_run(["validate", str(tmp_path / "absent.yaml")]) == 2


def test_paths_of_every_model_the_run_loads_are_checked(tmp_path):
    from tuneline.config import load_config
    from tuneline.errors import ConfigError

    path = tmp_path / "ppo.yaml"
    path.write_text(f"model_name_or_path: {tmp_path}\nstage: ppo\nreward_model: ./no/such/rm\n"
                    "adapter_name_or_path: ./no/such/adapter\ndo_train: false\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "'reward_model' path './no/such/rm' does not exist" in str(err.value)
    assert "'adapter_name_or_path' path './no/such/adapter' does not exist" in str(err.value)


def test_early_stopping_needs_evaluations_and_an_eval_split(tmp_path):
    from tuneline.config import load_config
    from tuneline.errors import ConfigError

    path = tmp_path / "es.yaml"
    path.write_text(f"model_name_or_path: {tmp_path}\nstage: sft\nearly_stopping_steps: 3\ndo_train: false\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "'early_stopping_steps' needs an evaluation split" in str(err.value)
    assert "counts evaluations, but none run" in str(err.value)


def test_ppo_runs_on_several_processes_but_refuses_deepspeed_and_fsdp(tmp_path):
    ppo = BASE + "stage: ppo\nreward_model: org/rm\n"
    load_config(write(tmp_path, ppo + "num_processes: 2\n"), check_paths=False)
    message = problems_of(tmp_path, ppo + "num_processes: 2\ndeepspeed: ds_z2_config.json\naccelerate_config: f.yaml\n")
    assert "'stage: ppo' runs data parallel" in message and "num_processes: 2" not in message
    assert "'deepspeed: ds_z2_config.json'" in message and "'accelerate_config: f.yaml'" in message
    load_config(write(tmp_path, BASE + "stage: dpo\nnum_processes: 2\ndeepspeed: ds.json\n"), check_paths=False)


def test_validate_says_up_front_when_a_run_will_not_be_evaluated(tmp_path, capsys):
    data = f"dataset_dir: {Path(__file__).resolve().parents[2] / 'data'}\n"
    assert cli_run(["validate", str(write(tmp_path, BASE + data))]) == 0
    assert "will not be evaluated" in capsys.readouterr().out
    assert cli_run(["validate", str(write(tmp_path, BASE + data + "val_size: 0.1\n"))]) == 0
    assert "will not be evaluated" not in capsys.readouterr().out
    assert cli_run(["validate", str(write(tmp_path, BASE + data + "eval_strategy: steps\n"))]) == 2
    assert "'eval_strategy: steps' evaluates during training" in capsys.readouterr().err


@pytest.mark.parametrize("line, named", [
    ("streaming: true", "'streaming: true' is not supported"),
    ("buffer_size: 100", "'buffer_size: 100' only applies to 'streaming'"),
    ("export_device: auto", "'export_device: auto'"),
    ("pref_loss: hinge\ndpo_label_smoothing: 0.1", "'dpo_label_smoothing: 0.1' smooths the sigmoid loss"),
    ("report_to: wandb", "'report_to: wandb'"),
])
def test_a_key_tuneline_would_not_honour_is_refused_not_ignored(tmp_path, line, named):
    from tuneline.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(named)):
        load_config(write(tmp_path, BASE + line + "\n"), check_paths=False)
    for accepted in ("report_to: none", "report_to: mlflow", "enable_thinking: true", "export_device: cpu"):
        load_config(write(tmp_path, BASE + accepted + "\n"), check_paths=False)


def test_a_checked_config_is_read_once_per_process_and_each_caller_gets_its_own(tmp_path, monkeypatch,
                                                                               tiny_model_dir):
    """The command, the flow run's name and the flow ask for the same config: one read and check, three copies; an
    edited file is read again."""
    import tuneline.pipeline.preflight as preflight

    reads = []
    real = preflight.load_config
    monkeypatch.setattr(preflight, "load_config", lambda *a, **k: reads.append(a) or real(*a, **k))
    path = tmp_path / "run.yaml"
    base = f"model_name_or_path: {tiny_model_dir}\ndataset: demo_sft\ndataset_dir: {Path(__file__).resolve().parents[2] / 'data'}\n"
    path.write_text(base)
    first = preflight.checked_config(path, ["learning_rate=1e-4"])
    second = preflight.checked_config(path, ["learning_rate=1e-4"])
    assert len(reads) == 1 and first is not second and first.training == second.training
    first.training["learning_rate"] = 1.0
    assert preflight.checked_config(path, ["learning_rate=1e-4"]).training["learning_rate"] == 1e-4
    path.write_text(base + "seed: 7\n")
    assert preflight.checked_config(path, ["learning_rate=1e-4"]).training["seed"] == 7 and len(reads) == 2
