"""The finetune flow on a tiny Gemma 3 with LLaMA-Factory's mllm_demo (real Prefect API, real MLflow store): the
model card and the MLflow run show the held-out images with the base and the tuned answers side by side."""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path

import pytest
import yaml
from test_finetune_flow import run_flow

MLLM = Path(__file__).resolve().parents[1] / "fixtures" / "llamafactory" / "0.9.5" / "data"


@pytest.mark.slow
def test_the_card_and_the_run_show_held_out_images_with_both_answers(prefect_api, tiny_vlm, tmp_path):
    from PIL import Image

    from tuneline import tracking

    data = shutil.copytree(MLLM, tmp_path / "data")
    config = {"model_name_or_path": str(tiny_vlm("gemma3")), "stage": "sft", "finetuning_type": "lora",
              "lora_target": "all", "dataset": "mllm_demo", "dataset_dir": str(data), "template": "gemma3",
              "val_size": 2, "output_dir": str(tmp_path / "out"), "max_steps": 2, "save_steps": 2,
              "per_device_train_batch_size": 2, "eval_max_new_tokens": 4,
              "pipeline_cache_dir": str(tmp_path / "cache"), "mlflow_tracking_uri": f"sqlite:///{tmp_path}/m.db",
              "mlflow_experiment": "vlm-flow-test"}
    path = tmp_path / "vlm.yaml"
    path.write_text(yaml.safe_dump(config))

    result, states = run_flow(path)
    assert states["model-card"] == ["Completed"]
    card = Path(result["model_card"]).read_text()
    gallery = tmp_path / "out" / "held_out_images"
    rows = json.loads((gallery / "answers.json").read_text())
    assert len(rows) == 2, "both held-out rows have images"
    for i, row in enumerate(rows, 1):
        assert row["images"] and all(Path(image).parent == data / "mllm_demo_data" for image in row["images"])
        assert row["label"] and isinstance(row["base"], str) and isinstance(row["tuned"], str)
        assert "&lt;image&gt;" in card and "image_soft_token" not in card, "one <image> per image, HTML-escaped"
        for k, image in enumerate(row["images"], 1):
            thumbnail = gallery / f"{i}-{k}.png"
            assert f"![{Path(image).name}](held_out_images/{i}-{k}.png)" in card
            with Image.open(thumbnail) as shown, Image.open(image) as original:
                assert max(shown.size) <= 256 and shown.size[0] / shown.size[1] == pytest.approx(
                    original.size[0] / original.size[1], rel=0.02)
        cells = [html.escape(row[key]).replace("|", "\\|").replace("\n", " ").strip() or "(empty)"  # a tiny model may answer nothing
                 for key in ("label", "base", "tuned")]
        assert " | ".join(cells) + " |" in card, "reference, base and tuned answers side by side"
    assert card.index("## Held-out images") < card.index("## Training curves")

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=config["mlflow_tracking_uri"])
    logged = {info.path for info in client.list_artifacts(result["mlflow_run_id"], "held_out_images")}
    assert logged == {f"held_out_images/{name.name}" for name in gallery.iterdir()}
    assert "README.md" in {info.path for info in client.list_artifacts(result["mlflow_run_id"])}
    assert tracking.get_run_metrics(config["mlflow_tracking_uri"], result["mlflow_run_id"]), "the run was recorded"
