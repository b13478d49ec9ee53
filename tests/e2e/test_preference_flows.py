"""dpo, ppo and grpo through the whole flow on the tiny model, against a real Prefect API and MLflow store: the
reference step is a cache hit across a pref_beta sweep, ppo trains its reward model first as a subflow, and grpo
scores with a built-in, a file's function and that reward model, logging trl's step metrics to MLflow."""

import json
import shutil

import pytest
import yaml

from tests.support.flows import REPO, STEPS, run_flow


@pytest.fixture(scope="module")
def root(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("preference")
    shutil.copytree(REPO / "data", root / "data")
    common = {"model_name_or_path": str(tiny_model_dir), "finetuning_type": "lora", "lora_rank": 8,
              "dataset_dir": str(root / "data"), "template": "chatml", "cutoff_len": 64, "logging_steps": 2,
              "per_device_train_batch_size": 8, "per_device_eval_batch_size": 16, "learning_rate": 3.0e-3,
              "pipeline_cache_dir": str(root / "cache"), "mlflow_tracking_uri": f"sqlite:///{root / 'mlflow.db'}",
              "mlflow_experiment": "preference-flows", "eval_max_samples": 8, "save_steps": 10}
    configs = {
        "dpo": {"stage": "dpo", "dataset": "demo_pref", "eval_dataset": "demo_pref_eval", "max_samples": 64,
                "max_steps": 6, "output_dir": str(root / "dpo")},
        "rm": {"stage": "rm", "dataset": "demo_pref", "max_samples": 64, "val_size": 16, "max_steps": 8,
               "output_dir": str(root / "rm")},
        "ppo": {"stage": "ppo", "dataset": "demo_sft", "max_samples": 48, "val_size": 8, "max_steps": 3,
                "per_device_train_batch_size": 4, "ppo_epochs": 1, "max_new_tokens": 4,
                "reward_model_config": str(root / "rm.yaml"), "output_dir": str(root / "ppo")},
        "grpo": {"stage": "grpo", "dataset": "demo_sft", "max_samples": 48, "val_size": 8, "max_steps": 3,
                 "per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 4, "beta": 0.04,
                 "reward_funcs": ["think_format", f"{root / 'rewards.py'}:letter_share"],
                 "reward_weights": [1.0, 1.0, 0.5], "reward_model_config": str(root / "rm.yaml"),
                 "output_dir": str(root / "grpo")},
    }
    (root / "rewards.py").write_text("def letter_share(completions, **kwargs):\n"
                                     "    return [sum(c.isalpha() for c in t) / max(len(t), 1) for t in completions]\n")
    for name, values in configs.items():
        (root / f"{name}.yaml").write_text(yaml.safe_dump({**common, **values}))
    return root


def test_dpo_sweep_over_pref_beta_reuses_the_reference_log_probs(prefect_api, root):
    result, states = run_flow(root / "dpo.yaml")
    assert set(states) == STEPS and states["build-reference-model"] == ["Completed"], states
    (marker,) = (root / "cache" / "build-reference-model").glob("*/COMPLETE")
    made = json.loads(marker.read_text())
    assert made["computed_rows"] == 6 * 8 + made["rows"]["validation"], "only the rows 6 steps of 8 pairs visit"
    assert made["visited_rows"]["train"] == 48 < made["rows"]["train"], made
    assert "reward_accuracy" in result["tuned"] and "reward_accuracy" in result["base"]

    from orchestration.parameters import Settings

    _, states = run_flow(root / "dpo.yaml", [f"output_dir={root / 'dpo_beta'}"], Settings(pref_beta=0.3))
    assert states["build-reference-model"] == ["Cached"], states
    assert states["train"] == ["Completed"], states
    assert "pref_beta: 0.3" in (root / "dpo_beta" / "tuneline_config.yaml").read_text(), "the UI form's field"


def test_ppo_trains_its_reward_model_first_as_a_subflow(prefect_api, root):
    from mlflow import MlflowClient

    result, states = run_flow(root / "ppo.yaml")
    assert STEPS <= set(states) and states["train"] == ["Completed"], states
    assert (root / "rm" / "adapter_config.json").is_file(), "the rm subflow trained the reward model"
    assert {"reward"} == set(result["base"]) == set(result["tuned"])
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    params = client.get_run(result["mlflow_run_id"]).data.params
    assert params["reward_model"] == str(root / "rm") and params["stage"] == "ppo"
    stages = {run.data.params.get("stage") for run in client.search_runs(
        [client.get_experiment_by_name("preference-flows").experiment_id])}
    assert {"rm", "ppo"} <= stages, "the reward model has its own MLflow run"

    marker = (root / "rm" / "run.json").stat().st_mtime_ns
    again, states = run_flow(root / "ppo.yaml")
    assert all(set(s) == {"Cached"} for name, s in states.items() if name in STEPS), states
    assert (root / "rm" / "run.json").stat().st_mtime_ns == marker, "the reward model is not retrained"
    assert again["mlflow_run_id"] == result["mlflow_run_id"]


def test_grpo_scores_with_a_builtin_a_function_and_the_reward_model_its_config_trains(prefect_api, root):
    from mlflow import MlflowClient

    result, states = run_flow(root / "grpo.yaml")
    assert STEPS <= set(states) and states["train"] == ["Completed"], states
    names = {"reward", "reward_think_format", "reward_letter_share", "reward_rm"}
    assert set(result["base"]) == set(result["tuned"]) == names, "the before/after table: each reward and the total"
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    run = client.get_run(result["mlflow_run_id"])
    assert run.data.params["stage"] == "grpo" and str(root / "rm") in run.data.params["reward_funcs"]
    for metric in ("rewards/letter_share/mean", "rewards/rm/mean", "reward_std", "kl", "completions/mean_length"):
        history = client.get_metric_history(result["mlflow_run_id"], metric)
        assert sorted(m.step for m in history) == [2, 3], metric  # by global step: logging_steps and the last
    assert (root / "grpo" / "training_reward.png").is_file(), "the plot step draws the reward curve"
