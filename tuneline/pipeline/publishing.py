"""The model-card step's publishing, from the flow's side: the files the run logged to MLflow as its model, with
the card as README.md, to the Hugging Face Hub (tuneline.hub.publish talks to the hub), and the result as run tags."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tuneline import tracking
from tuneline.config import RunConfig
from tuneline.hub.publish import publish_folder
from tuneline.pipeline.record import final_model_files
from tuneline.pipeline.records import MlflowRun
from tuneline.report.image_answers import GALLERY_DIR

REPO_TAG = "tuneline.hub_repo"  # the repo's URL
COMMIT_TAG = "tuneline.hub_commit"  # the URL of the commit that published this run's model


def publish_model(config: RunConfig, output_dir: str | Path, card_path: str | Path, run: MlflowRun | None) -> dict | None:
    """With `push_to_hub`, upload output_dir's final model files and the model card, and tag the MLflow run with
    the repo and the commit; None without `push_to_hub`."""
    if not config.training.get("push_to_hub"):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        folder = final_model_files(Path(output_dir), Path(tmp) / "model")
        shutil.copyfile(card_path, folder / "README.md")
        gallery = Path(card_path).parent / GALLERY_DIR  # the held-out images the card shows
        if gallery.is_dir():
            shutil.copytree(gallery, folder / GALLERY_DIR)
        published = publish_folder(config, folder)
    if run:
        tracking.add_tags(run.run_id, {REPO_TAG: published["url"], COMMIT_TAG: published["commit_url"]},
                          tracking_uri=run.tracking_uri)
    return published
