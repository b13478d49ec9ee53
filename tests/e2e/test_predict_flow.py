"""`do_predict` without training (LLaMA-Factory's nlg_eval): the predict flow against a real Prefect API and MLflow
SQLite store, on the tiny model, through `tuneline train` and `tuneline predict`."""

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.support.flows import flow_artifacts, task_states

REPO = Path(__file__).resolve().parents[2]
SCORES = {"predict_rouge-1", "predict_rouge-2", "predict_rouge-l", "predict_bleu-4"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("predict")
    shutil.copytree(REPO / "data", root / "data")
    config = {
        "model_name_or_path": str(tiny_model_dir), "stage": "sft", "finetuning_type": "lora",
        "eval_dataset": "demo_sft_eval", "dataset_dir": str(root / "data"), "template": "chatml", "cutoff_len": 64,
        "max_samples": 12, "do_sample": False, "max_new_tokens": 6, "per_device_eval_batch_size": 4,
        "output_dir": str(root / "out"), "pipeline_cache_dir": str(root / "cache"),
        "mlflow_tracking_uri": f"sqlite:///{root / 'mlflow.db'}", "mlflow_experiment": "predict-test",
    }
    (root / "base.yaml").write_text(yaml.safe_dump(config))  # what `tuneline predict` adds the do_predict keys to
    (root / "predict.yaml").write_text(yaml.safe_dump({**config, "do_predict": True, "predict_with_generate": True}))
    return root


def cli(*argv) -> dict:
    from cli.main import run

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert run(list(argv)) == 0
    return json.loads(printed.getvalue()[printed.getvalue().index("{"):])


def test_a_do_predict_config_answers_the_eval_set_logs_the_scores_and_is_cached(prefect_api, workdir):
    from mlflow import MlflowClient

    from flows.finetune import predict_flow

    result = cli("train", str(workdir / "predict.yaml"))  # a LLaMA-Factory user's command: no train step runs
    out = workdir / "out"
    lines = [json.loads(line) for line in (out / "generated_predictions.jsonl").read_text().splitlines()]
    assert len(lines) == 12 and all(list(row) == ["prompt", "predict", "label"] for row in lines)
    assert all(row["label"] and "<|im_start|>assistant" in row["prompt"] for row in lines)
    assert set(result["predict"]) == SCORES and all(0 <= v <= 100 for v in result["predict"].values())
    assert json.loads((out / "predict_results.json").read_text()) == result["predict"]
    assert not (out / "adapter_model.safetensors").exists() and not (out / "trainer_log.jsonl").exists()

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    run = client.get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert {k: run.data.metrics[k] for k in SCORES} == pytest.approx(result["predict"])
    assert {"generated_predictions.jsonl", "predict_results.json"} <= {a.path for a in client.list_artifacts(
        run.info.run_id)}

    state = predict_flow(str(workdir / "base.yaml"), overrides=["do_predict=true", "predict_with_generate=true",
                                                                  "do_train=false"], return_state=True)
    again = state.result()
    flow_run_id = state.state_details.flow_run_id
    assert task_states(flow_run_id, last="predict")["predict"] == ["Cached"], "the same question, the same model"
    assert again["predict"] == result["predict"] and again["mlflow_run_id"] == result["mlflow_run_id"]
    artifacts = flow_artifacts(flow_run_id)
    assert "predict_bleu-4" in artifacts["run-summary"] and "generated_predictions.jsonl" in artifacts["run-summary"]

    other = cli("predict", str(workdir / "base.yaml"), "max_new_tokens=3")  # another generating key: answered anew
    assert other["cache_hit"] is False and other["mlflow_run_id"] != result["mlflow_run_id"]


def test_predicting_without_an_eval_set_is_refused_with_what_to_set(workdir, capsys):
    from cli.main import run

    config = yaml.safe_load((workdir / "base.yaml").read_text())
    del config["eval_dataset"]
    (workdir / "no_eval.yaml").write_text(yaml.safe_dump({**config, "output_dir": str(workdir / "refused")}))
    assert run(["predict", str(workdir / "no_eval.yaml")]) == 2
    refused = capsys.readouterr().err
    assert "do_predict" in refused and "eval_dataset" in refused and "Traceback" not in refused
    assert not (workdir / "refused").exists()


@pytest.mark.parametrize("command", ["validate", "predict", "train"])
def test_training_keys_in_a_prediction_are_refused_in_one_message_by_each_command(workdir, capsys, command):
    from cli.main import run

    config = yaml.safe_load((workdir / "predict.yaml").read_text())
    (workdir / "predict_lr.yaml").write_text(yaml.safe_dump({**config, "output_dir": str(workdir / "refused"),
                                                             "learning_rate": 1.0e-4, "lora_rank": 16}))
    assert run([command, str(workdir / "predict_lr.yaml"), "num_train_epochs=2"]) == 2
    refused = capsys.readouterr().err
    assert "problems)" not in refused and "Traceback" not in refused
    assert "'lora_rank: 16', 'learning_rate: 0.0001', 'num_train_epochs: 2.0'; remove them" in refused
    assert "remove them, or set 'do_train: true' to train first" in refused
    assert not (workdir / "refused").exists()


def test_a_run_that_trains_then_predicts_logs_the_answers_and_their_scores_in_its_mlflow_run(prefect_api, workdir):
    """`do_train: true` with `do_predict: true`: the training child answers the eval set after training, and the
    flow's train step (record_training) puts the answers and their scores in the run's MLflow record."""
    from mlflow import MlflowClient

    config = yaml.safe_load((workdir / "predict.yaml").read_text())
    out = workdir / "trained"
    config.update({"do_train": True, "dataset": "demo_sft", "max_samples": 8, "max_steps": 2,
                   "per_device_train_batch_size": 4, "save_steps": 2, "logging_steps": 1, "output_dir": str(out),
                   "eval_max_samples": 2, "eval_max_new_tokens": 2, "mlflow_experiment": "train-and-predict"})
    (workdir / "train_predict.yaml").write_text(yaml.safe_dump(config))

    result = cli("train", str(workdir / "train_predict.yaml"))
    scores = json.loads((out / "predict_results.json").read_text())
    assert set(scores) == SCORES and (out / "adapter_model.safetensors").is_file(), "trained, then answered"
    answers = (out / "generated_predictions.jsonl").read_text().splitlines()
    assert len(answers) == 8 and all(json.loads(line)["label"] for line in answers)

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    run = client.get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert {k: run.data.metrics[k] for k in SCORES} == pytest.approx(scores)
    assert "generated_predictions.jsonl" in {a.path for a in client.list_artifacts(run.info.run_id)}
