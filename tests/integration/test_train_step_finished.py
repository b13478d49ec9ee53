"""The train step meets an output_dir whose training the child finished (run.json says complete, as the child
leaves it) but whose result the flow never added (killed in between): the step stands on that training, as it is,
without launching again, and returns the full reference a later step reads."""

from __future__ import annotations

import json

from tuneline.config import load_config
from tuneline.content.records import BuiltDataset
from tuneline.identity import keys
from tuneline.pipeline.records import TrainResult
from tuneline.pipeline.train_step import prepare_training
from tuneline.runtime.contract import COMPLETE, read_run_file, write_run_file
from tuneline.train.output_dir import prepare_output_dir


def test_a_training_the_child_finished_and_the_flow_never_recorded_stands(tmp_path, tiny_model_dir):
    config = load_config(None, {"model_name_or_path": str(tiny_model_dir), "stage": "sft", "dataset": "demo_sft",
                                "dataset_dir": "data", "template": "chatml", "output_dir": str(tmp_path / "out"),
                                "pipeline_cache_dir": str(tmp_path / "cache")})
    dataset = BuiltDataset(path=str(tmp_path / "data"), fingerprint="d" * 64)
    key = keys.train_key(config, dataset.fingerprint, None)
    resume_key = keys.resume_key(config, dataset.fingerprint, None)
    # the child's side, exactly as tuneline.train writes it: prepare, train, mark complete
    lock, _ = prepare_output_dir(config, key, "mlflow-run-1", resume_key)
    (config.output_dir / "all_results.json").write_text(json.dumps({"train_loss": 1.5, "epoch": 1.0}))
    write_run_file(config.output_dir, status=COMPLETE, global_step=6)
    lock.release()
    before = read_run_file(config.output_dir)

    lines: list[str] = []
    launch = prepare_training(config, dataset, None, key, "mlflow-run-1", None, on_line=lines.append)

    assert launch.command == []  # nothing trains again
    assert launch.result() == TrainResult(output_dir=str(config.output_dir), train_key=key,
                                          metrics={"train_loss": 1.5, "epoch": 1.0}, mlflow_run_id="mlflow-run-1",
                                          resume_key=resume_key)
    assert read_run_file(config.output_dir) == before  # read, not rewritten
