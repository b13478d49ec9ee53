"""The finetune flow on a tiny Gemma 3 with LLaMA-Factory's mllm_demo (real Prefect API, real MLflow store): the
model card and the MLflow run show the held-out images with the base and the tuned answers side by side."""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.support.flows import REPO, run_flow

MLLM = Path(__file__).resolve().parents[1] / "fixtures" / "llamafactory" / "0.9.5" / "data"


def gemma3_run(tiny_vlm, tmp_path, **keys) -> tuple[Path, dict]:
    """A YAML of 2 LoRA steps on the tiny gemma3 with a copy of mllm_demo, and its keys."""
    data = shutil.copytree(MLLM, tmp_path / "data")
    config = {"model_name_or_path": str(tiny_vlm("gemma3")), "stage": "sft", "finetuning_type": "lora",
              "lora_target": "all", "dataset": "mllm_demo", "dataset_dir": str(data), "template": "gemma3",
              "output_dir": str(tmp_path / "out"), "max_steps": 2, "save_steps": 2, "per_device_train_batch_size": 2,
              "pipeline_cache_dir": str(tmp_path / "cache"), "mlflow_tracking_uri": f"sqlite:///{tmp_path}/m.db",
              "mlflow_experiment": "vlm-flow-test", **keys}
    path = tmp_path / "vlm.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, config


def test_the_card_and_the_run_show_held_out_images_with_both_answers(prefect_api, tiny_vlm, tmp_path):
    from PIL import Image

    from tuneline import tracking

    path, config = gemma3_run(tiny_vlm, tmp_path, val_size=2, eval_max_new_tokens=4)
    data = Path(config["dataset_dir"])

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


def test_pan_and_scan_runs_through_the_flow(prefect_api, tiny_vlm, tmp_path):
    """`image_do_pan_and_scan: true` as a user's YAML sets it: the flow accepts it, builds the rows with each image's
    crops (images grown to 400 x 400 pixels, so the wide demo images are cut) and trains on them."""
    from tuneline.data import build_dataset, load_processed
    from tuneline.model.processor import load_processor
    from tuneline.pipeline.preflight import checked_config

    path, _ = gemma3_run(tiny_vlm, tmp_path, image_do_pan_and_scan=True, image_min_pixels=400 * 400)

    _, states = run_flow(path)
    assert states["train"] == ["Completed"]
    logged = [json.loads(line) for line in (tmp_path / "out" / "trainer_log.jsonl").read_text().splitlines()]
    assert logged[-1]["current_steps"] == 2
    built = build_dataset(checked_config(path))  # the flow's own entry: the same key, a cache hit
    assert built["cache_hit"]
    rows = load_processed(built)["train"]
    begin = load_processor(checked_config(path)).tokenizer.convert_tokens_to_ids("<start_of_image>")
    assert sum(row["input_ids"].count(begin) for row in rows) > sum(len(row["images"]) for row in rows)


def test_a_cutoff_len_that_cuts_an_image_ends_the_flow_before_training_with_one_message(prefect_api, tiny_vlm,
                                                                                         tmp_path):
    """`cutoff_len: 64` on the tiny gemma3 and mllm_demo, as a user would run it: the build-dataset step refuses the
    first row whose second image's tokens the cut leaves out (the training child used to die in the forward with
    "Image features and image tokens do not match"), naming the row, the tokens and the cutoff_len that keeps them."""
    import os
    import subprocess
    import sys

    from prefect.settings import PREFECT_API_URL

    path, _ = gemma3_run(tiny_vlm, tmp_path, cutoff_len=64)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    done = subprocess.run([sys.executable, "-m", "flows.finetune", str(path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in output, output[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "mllm_demo.json: row 1: image tokens cut by cutoff_len: its 2 images need " in last, last
    assert "and cutoff_len 64 keeps" in last and "set cutoff_len to" in last and "on_bad_rows: skip" in last, last
    assert not (tmp_path / "out" / "trainer_log.jsonl").exists(), "refused before training"
