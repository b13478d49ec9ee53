"""The retrain flow against a real Prefect API and MLflow registry: it trains only on new data and moves the
`champion` alias only for a better model."""

import json
import shutil

import pytest
import yaml

from tests.support.flows import REPO

NAME = "retrain-test-model"


@pytest.fixture(scope="module")
def root(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("retrain")
    shutil.copytree(REPO / "data", root / "data")
    config = {
        "model_name_or_path": str(tiny_model_dir), "stage": "sft", "finetuning_type": "lora", "lora_rank": 8,
        "dataset": "demo_sft", "eval_dataset": "demo_sft_eval", "dataset_dir": str(root / "data"),
        "template": "chatml", "cutoff_len": 64, "max_samples": 64, "max_steps": 4, "save_steps": 10,
        "per_device_train_batch_size": 8, "learning_rate": 3.0e-3, "per_device_eval_batch_size": 16,
        "eval_max_samples": 8, "eval_max_new_tokens": 4, "output_dir": str(root / "out"),
        "pipeline_cache_dir": str(root / "cache"), "mlflow_tracking_uri": f"sqlite:///{root / 'mlflow.db'}",
        "mlflow_experiment": "retrain-test",
    }
    (root / "sft.yaml").write_text(yaml.safe_dump(config))
    return root


def test_retrain_trains_on_new_data_only_and_promotes_only_a_better_model(prefect_api, root):
    from mlflow import MlflowClient

    from flows.retrain import retrain

    config = str(root / "sft.yaml")
    first = retrain(config, NAME)
    assert (first["decision"], first["version"]) == ("champion", "1") and "first version" in first["reason"]

    again = retrain(config, NAME)
    assert again["decision"] == "unchanged" and "data unchanged since version 1" in again["reason"]

    rows = json.loads((root / "data" / "demo_sft.json").read_text())
    (root / "data" / "demo_sft.json").write_text(json.dumps(list(reversed(rows))))  # the night's new data
    strict = retrain(config, NAME, promotion_min_delta=100.0, overrides=[f"output_dir={root / 'out2'}"])
    assert (strict["decision"], strict["version"], strict["champion"]) == ("challenger", "2", "1")
    assert strict["champion_score"] is not None and strict["new_score"] is not None, "both scored on one set"

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "1"
    assert str(client.get_model_version_by_alias(NAME, "challenger").version) == "2"
    assert client.get_model_version(NAME, "2").tags["tuneline.promotion"].startswith("not promoted: eval_loss")


def test_two_retrains_that_finish_at_once_never_both_promote(prefect_api, tmp_path):
    """Both beat the champion they compared against (version 1); the promotions run at the same moment, in turn
    under the Prefect lock: the second finds the champion changed and leaves the alias alone."""
    import contextvars
    import threading

    from mlflow import MlflowClient

    from flows.retrain import promote
    from tuneline.pipeline.promotion import Decision

    uri, name = f"sqlite:///{tmp_path / 'mlflow.db'}", "concurrent-model"
    client = MlflowClient(uri)
    client.create_registered_model(name)
    for _ in range(3):
        client.create_model_version(name, str(tmp_path / "model"))
    client.set_registered_model_alias(name, "champion", "1")
    champion = {"version": "1"}
    start, results = threading.Barrier(2), {}

    def retrain_finishing(version: str) -> None:
        start.wait()
        results[version] = promote(uri, name, version, champion, Decision(True, "better than version 1"))

    # each thread in a copy of this context: Prefect's settings (the run's one API) live in a context variable
    threads = [threading.Thread(target=contextvars.copy_context().run, args=(retrain_finishing, v))
               for v in ("2", "3")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    aliases = {v: alias for v, (alias, _) in results.items()}
    assert sorted(aliases.values()) == ["challenger", "champion"], results
    winner = next(v for v, alias in aliases.items() if alias == "champion")
    loser = next(v for v in aliases if v != winner)
    assert str(client.get_model_version_by_alias(name, "champion").version) == winner
    assert f"the champion became version {winner}" in results[loser][1].reason


@pytest.mark.parametrize(("metric", "message"), [
    ("exact_matc", "does not produce it; did you mean 'exact_match'"),
    ("train_loss", "the training loss is not measured"),
    ("reward_accuracy", "the sft evaluation does not produce it"),
])
def test_a_promotion_metric_the_evaluation_never_reports_is_refused_before_training(capsys, tmp_path, monkeypatch,
                                                                                    metric, message):
    from cli.main import run

    monkeypatch.chdir(REPO)
    store = tmp_path / "mlflow.db"
    argv = ["retrain", "examples/sft_lora_demo.yaml", "demo-model", f"mlflow_tracking_uri=sqlite:///{store}",
            f"output_dir={tmp_path / 'out'}", "--metric", metric]
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert f"promotion metric {metric}" in err and message in err and "Traceback" not in err, err
    assert not store.exists(), "refused before any run was recorded"
