"""Sweep grids: parsing, the cartesian product, seeded samples from ranges, each point's config, and the messages
for bad input, all before anything trains."""

from pathlib import Path

import pytest
import yaml

from tuneline.errors import ConfigError
from tuneline.evaluation.metric_names import STAGE_METRICS
from tuneline.pipeline.sweep_grid import (
    grid_points,
    parse_axes,
    parse_grid_args,
    plan_sweep,
    point_folder,
    shares_reward_model_steps,
)

DATA = Path(__file__).parents[2] / "data"


def refused(call, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as caught:
        call(*args, **kwargs)
    return str(caught.value)


@pytest.fixture
def dpo_config(tmp_path) -> Path:
    path = tmp_path / "dpo.yaml"
    path.write_text(yaml.safe_dump({
        "model_name_or_path": "org/model", "stage": "dpo", "finetuning_type": "lora", "dataset": "demo_pref",
        "eval_dataset": "demo_pref_eval", "dataset_dir": str(DATA), "template": "chatml",
        "output_dir": str(tmp_path / "out"), "mlflow_experiment": "sweeps"}))
    return path


def test_grid_words_become_typed_value_lists():
    grid = parse_grid_args(["learning_rate=1e-4,5e-5", "pref_beta=0.1,0.3", 'dataset=[demo_pref, "a,b"]'])
    axes = parse_axes({**grid, "lora_rank": [8, 16], "disable_shuffling": "true,false"})
    assert axes == {"learning_rate": [1e-4, 5e-5], "pref_beta": [0.1, 0.3], "dataset": ["demo_pref", "a,b"],
                    "lora_rank": [8, 16], "disable_shuffling": [True, False]}


def test_the_grid_is_the_cartesian_product_in_key_order():
    points = grid_points(parse_axes({"learning_rate": "1e-4,5e-5", "pref_beta": "0.1,0.3,0.5"}))
    assert len(points) == 6
    assert points[:3] == [{"learning_rate": 1e-4, "pref_beta": beta} for beta in (0.1, 0.3, 0.5)]
    assert len({tuple(p.values()) for p in points}) == 6


def test_ranges_draw_seeded_distinct_points_log_uniform_over_decades():
    axes = parse_axes({"learning_rate": "1e-5:1e-3", "lora_rank": "4:64", "pref_beta": "0.1:0.5"})
    assert axes["learning_rate"].log and not axes["pref_beta"].log and axes["lora_rank"].integer
    points = grid_points(axes, samples=200, seed=3)
    assert points == grid_points(axes, samples=200, seed=3) != grid_points(axes, samples=200, seed=4)
    rates = [p["learning_rate"] for p in points]
    assert all(1e-5 <= r <= 1e-3 for r in rates)
    below = sum(r < 1e-4 for r in rates) / len(rates)
    assert 0.35 < below < 0.65, "log-uniform: each decade about as likely (uniform would put ~9% below 1e-4)"
    assert all(float(f"{r:.3g}") == r for r in rates), "three significant digits"
    assert all(isinstance(p["lora_rank"], int) and 4 <= p["lora_rank"] <= 64 for p in points)
    assert all(0.1 <= p["pref_beta"] <= 0.5 for p in points)


def test_samples_from_lists_pick_distinct_points_and_never_more_than_the_grid():
    axes = parse_axes({"learning_rate": "1e-4,5e-5", "pref_beta": "0.1,0.3"})
    points = grid_points(axes, samples=3, seed=0)
    assert len({tuple(p.values()) for p in points}) == 3
    assert "more than the 4 points the grid holds" in refused(grid_points, axes, samples=5)
    assert "--samples is 0" in refused(grid_points, axes, samples=0)


def test_a_range_without_samples_is_refused_with_the_fix():
    message = refused(grid_points, parse_axes({"learning_rate": "1e-5:1e-3"}))
    assert "'learning_rate=1e-5:1e-3' is a range: set --samples N" in message


def test_every_bad_grid_entry_is_named_at_once():
    message = refused(parse_axes, {"learnin_rate": "1e-4", "pref_beta": "", "lora_rank": "8,,16",
                                   "output_dir": "a,b", "hf_hub_token": "x,y", "mlflow_experiment": "a,b",
                                   "lora_dropout": "0.5:0.1", "learning_rate": "[1e-4"})
    assert "(8 problems)" in message
    for part in ("unknown key 'learnin_rate' in the grid; did you mean 'learning_rate'?",
                 "'pref_beta' has no values", "'lora_rank=8,,16' has an empty value between commas",
                 "'output_dir' cannot be swept", "'hf_hub_token' is a credential",
                 "'mlflow_experiment' cannot be swept", "'lora_dropout=0.5:0.1': a range's low end must be below",
                 "'learning_rate=[1e-4' is not readable as YAML"):
        assert part in message
    assert "at least one grid key" in refused(parse_axes, {})


def test_grid_words_without_a_key_or_given_twice_are_refused():
    message = refused(parse_grid_args, ["learning_rate", "=1", "pref_beta=0.1", "pref_beta=0.3"])
    assert "'learning_rate' is not of the form key=v1,v2" in message and "'=1'" in message
    assert "names 'pref_beta' twice" in message


def test_each_point_gets_its_own_folder_run_name_and_the_base_experiment(dpo_config, tmp_path):
    points = plan_sweep(str(dpo_config), {"learning_rate": "1e-4,5e-5", "pref_beta": [0.1, 0.3]},
                        overrides=["max_steps=3"])
    assert [p.label for p in points][:2] == ["learning_rate=0.0001 pref_beta=0.1",
                                             "learning_rate=0.0001 pref_beta=0.3"]
    folders = {p.config.output_dir for p in points}
    assert len(folders) == 4 and {f.parent for f in folders} == {tmp_path / "out-sweep"}
    assert points[0].config.output_dir.name == "learning_rate=0.0001_pref_beta=0.1"
    for point in points:
        assert point.config.training["max_steps"] == 3 and point.config.experiment_name == "sweeps"
        assert point.config.training["learning_rate"] == point.values["learning_rate"]
        assert point.config.finetuning.pref_beta == point.values["pref_beta"]
        assert point.label in point.config.run_name


def test_a_value_the_config_cannot_take_is_refused_naming_key_value_and_point(dpo_config):
    message = refused(plan_sweep, str(dpo_config), {"learning_rate": "1e-4,abc", "pref_beta": "0.1,0.3"})
    assert "'learning_rate' is 'abc' (str); expected a number (point learning_rate=abc pref_beta=0.1)" in message
    assert message.count("'abc'") == 1, "one problem said once, not once per point"


def test_a_metric_the_evaluation_does_not_produce_is_refused(dpo_config, tmp_path):
    message = refused(plan_sweep, str(dpo_config), {"pref_beta": "0.1,0.3"}, metric="bleu4")
    assert "--metric bleu4: the dpo evaluation does not produce it" in message and "reward_accuracy" in message
    plan_sweep(str(dpo_config), {"pref_beta": "0.1,0.3"}, metric="reward_accuracy")
    no_validation = ["eval_dataset=null"]
    message = refused(plan_sweep, str(dpo_config), {"pref_beta": "0.1,0.3"}, overrides=no_validation)
    assert "--metric eval_loss is measured on a held-out set and this config has none" in message
    assert len(plan_sweep(str(dpo_config), {"pref_beta": "0.1,0.3"}, overrides=no_validation,
                          metric="train_loss")) == 2
    assert "--max-parallel is 0" in refused(plan_sweep, str(dpo_config), {"pref_beta": "0.1"}, max_parallel=0)


def test_folder_names_stay_safe_and_unique():
    assert point_folder({"learning_rate": 1e-4}) == "learning_rate=0.0001"
    odd = point_folder({"model_name_or_path": "org/model a"})
    assert "/" not in odd and " " not in odd and odd != point_folder({"model_name_or_path": "org_model_a"})
    assert len(point_folder({"dataset": "x" * 300})) <= 100


def test_stage_metrics_are_the_names_the_evaluation_computes():
    """The table that refuses a --metric, pinned to the scoring functions that name the metrics."""
    from tuneline.evaluation import generation, scoring

    language = set(scoring.loss_metrics({"logp": [-1.0], "tokens": [1], "correct": [1]}))
    pairwise = set(scoring.pairwise_metrics([1.0], [0.0]))
    assert language == set(STAGE_METRICS["pt"])
    assert set(STAGE_METRICS["sft"]) == language | set(generation.text_metrics(["a b"], ["a b"]))
    assert set(STAGE_METRICS["dpo"]) == set(STAGE_METRICS["kto"]) == language | pairwise
    assert set(STAGE_METRICS["kto"]) == language | set(scoring.unpaired_metrics([1.0], [0.0]))
    assert set(STAGE_METRICS["rm"]) == set(scoring.bradley_terry_loss([1.0], [0.0])) | pairwise


def test_a_ppo_sweep_that_trains_its_reward_model_runs_its_points_one_at_a_time(tmp_path):
    common = {"model_name_or_path": "org/model", "finetuning_type": "lora", "dataset_dir": str(DATA),
              "template": "chatml"}
    (tmp_path / "rm.yaml").write_text(yaml.safe_dump({**common, "stage": "rm", "dataset": "demo_pref",
                                                      "output_dir": str(tmp_path / "rm")}))
    ppo = tmp_path / "ppo.yaml"
    ppo.write_text(yaml.safe_dump({**common, "stage": "ppo", "dataset": "demo_sft", "val_size": 8,
                                   "reward_model_config": str(tmp_path / "rm.yaml"),
                                   "output_dir": str(tmp_path / "ppo")}))
    message = refused(plan_sweep, str(ppo), {"learning_rate": "1e-4,5e-5"}, metric="reward", max_parallel=2)
    assert "would train it at once in one output_dir: use --max-parallel 1" in message
    points = plan_sweep(str(ppo), {"learning_rate": "1e-4,5e-5"}, metric="reward")
    assert not any(shares_reward_model_steps(p.config) for p in points), "its evaluation needs the reward model"
