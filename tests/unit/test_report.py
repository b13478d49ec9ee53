"""Training curves and the model card."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tuneline.config import load_config
from tuneline.report import framework_versions, plot_curves, smooth, write_model_card
from tuneline.report.plots import metric_series, read_trainer_log

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_log(path: Path, entries: list[dict], torn_tail: bool = False) -> Path:
    text = "".join(json.dumps(e) + "\n" for e in entries)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + ('{"current_steps": 9, "lo' if torn_tail else ""))
    return path


def training_log(tmp_path: Path) -> Path:
    entries = []
    for step in range(1, 21):
        entries.append({"current_steps": step, "total_steps": 20, "loss": 3.0 - 0.1 * step, "eval_loss": None,
                        "lr": 1e-4, "epoch": step / 20, "percentage": step * 5.0, "elapsed_time": "0:00:01"})
        if step % 5 == 0:
            entries.append({"current_steps": step, "total_steps": 20, "eval_loss": 3.2 - 0.1 * step})
    return write_log(tmp_path / "run" / "trainer_log.jsonl", entries, torn_tail=True)


# ----------------------------------------------------------------------------- smoothing and series
def test_smoothing_on_a_known_series():
    assert smooth([]) == []
    assert smooth([2.0, 2.0, 2.0]) == pytest.approx([2.0, 2.0, 2.0])
    # two points: weight = 1.8 * (sigmoid(0.1) - 0.5) = 0.0449625, seeded with the first value
    assert smooth([0.0, 10.0]) == pytest.approx([0.0, 9.55037], abs=1e-4)
    # 100 points: weight = 1.8 * (sigmoid(5) - 0.5) = 0.8879529; a step from 0 to 1 decays by that each point
    series = smooth([0.0] + [1.0] * 99)
    assert series[1] == pytest.approx(1 - 0.8879529, abs=1e-5)
    assert series[2] == pytest.approx(1 - 0.8879529 ** 2, abs=1e-5)


def test_series_skip_missing_null_and_non_finite_values(tmp_path):
    log = write_log(tmp_path / "log.jsonl", [
        {"current_steps": 1, "loss": 1.0}, {"current_steps": 2, "loss": None}, {"current_steps": 3},
        {"current_steps": 4, "loss": float("nan")}, {"step": 5, "loss": 0.5}, {"loss": 0.1},
    ])
    assert metric_series(read_trainer_log(log), "loss") == ([1, 5], [1.0, 0.5])


# ----------------------------------------------------------------------------- plots
def test_plots_for_present_keys_only(tmp_path):
    out = tmp_path / "plots"
    paths = plot_curves(training_log(tmp_path), out)
    assert [Path(p).name for p in paths] == ["training_loss.png", "training_eval_loss.png"]
    for path in paths:
        assert Path(path).read_bytes()[:8] == PNG_MAGIC
    assert sorted(p.name for p in out.iterdir()) == ["training_eval_loss.png", "training_loss.png"]  # no temps


def test_plots_for_chosen_keys_with_slashes(tmp_path):
    log = write_log(tmp_path / "trainer_log.jsonl", [
        {"current_steps": s, "loss": 1.0 / s, "rewards/accuracies": 0.1 * s} for s in range(1, 6)])
    paths = plot_curves(log, tmp_path / "plots", keys=["rewards/accuracies", "reward"])
    assert [Path(p).name for p in paths] == ["training_rewards_accuracies.png"]
    import matplotlib.image

    height, width = matplotlib.image.imread(paths[0]).shape[:2]
    assert (width, height) == (640, 480)  # matplotlib's default 6.4 x 4.8 in at dpi 100


# ----------------------------------------------------------------------------- model card
def card_config(tmp_path: Path, **overrides):
    values = {"model_name_or_path": "org/tiny-llama", "stage": "sft", "finetuning_type": "lora",
              "dataset": "demo_sft,demo_sharegpt", "eval_dataset": "demo_sft_eval", "learning_rate": 5e-4,
              "lora_rank": 16, "eval_max_new_tokens": 8, "hf_hub_token": "hf_secret", "push_to_hub": True, "hub_token": "hub_secret", "output_dir": str(tmp_path / "out"), **overrides}
    if values["finetuning_type"] != "lora":  # a LoRA key in another tuning is refused
        del values["lora_rank"]
    return load_config(None, values, check_paths=False)


def split_card(text: str) -> tuple[dict, str]:
    assert text.startswith("---\n")
    head, _, body = text[4:].partition("\n---\n")
    return yaml.safe_load(head), body


def write_card(tmp_path: Path, **overrides) -> tuple[dict, str]:
    out = tmp_path / "out"
    plots = plot_curves(training_log(tmp_path), out)
    path = write_model_card(
        card_config(tmp_path, **overrides), out,
        base_metrics={"eval_loss": 2.0, "exact_match": 0.0, "perplexity": 7.389},
        tuned_metrics={"eval_loss": 1.5, "exact_match": 0.75, "perplexity": 4.4817, "bleu4": 0.5},
        dataset_fingerprints={"demo_sft": "abc123", "validation": "def456"}, plots=plots,
        mlflow_run="[r1](http://127.0.0.1:5000/#/experiments/1/runs/r1)", framework_versions={"transformers": "5.0"})
    assert Path(path) == out / "README.md"
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []
    return split_card(Path(path).read_text(encoding="utf-8"))


def test_model_card_front_matter_for_lora(tmp_path):
    meta, _ = write_card(tmp_path)
    assert meta["base_model"] == "org/tiny-llama"
    assert meta["library_name"] == "peft"
    assert meta["license"] == "other"
    assert {"tuneline", "sft", "lora"} <= set(meta["tags"])
    assert meta["datasets"] == ["demo_sft", "demo_sharegpt", "demo_sft_eval"]


def test_model_card_body(tmp_path):
    _, body = write_card(tmp_path)
    assert "| eval_loss | 2 | 1.5 | -0.5 (better) |" in body
    assert "| exact_match | 0 | 0.75 | +0.75 (better) |" in body
    assert "| bleu4 | – | 0.5 | – |" in body
    assert "![training_loss](training_loss.png)" in body
    assert "![training_eval_loss](training_eval_loss.png)" in body
    assert "| learning_rate | 0.0005 |" in body and "| lora_rank | 16 |" in body
    assert "| lora_dropout |" not in body  # defaults are not repeated
    assert "hf_secret" not in body and "hub_secret" not in body and "| hub_token | *** |" in body
    assert "| eval_max_new_tokens | 8 |" in body  # a key with 'token' in its name is not a secret
    assert "| `demo_sft` | abc123 |" in body
    assert "MLflow run: [r1](http://127.0.0.1:5000/#/experiments/1/runs/r1)" in body
    assert "- transformers 5.0" in body
    assert "PeftModel.from_pretrained(base, " in body


def test_model_card_for_full_finetuning_and_no_mlflow(tmp_path):
    out = tmp_path / "full"
    path = write_model_card(card_config(tmp_path, finetuning_type="full"), out, base_metrics={},
                            tuned_metrics={"eval_loss": 1.0}, dataset_fingerprints={}, plots=[],
                            mlflow_run=None)
    meta, body = split_card(Path(path).read_text(encoding="utf-8"))
    assert meta["library_name"] == "transformers" and "full" in meta["tags"]
    assert "not tracked in MLflow" in body and "PeftModel" not in body
    assert f"AutoModelForCausalLM.from_pretrained({str(out)!r})" in body
    assert f"- torch {framework_versions()['torch']}" in body


def test_framework_versions_lists_installed_packages():
    versions = framework_versions()
    assert {"python", "torch", "transformers", "peft"} <= set(versions)
    assert all(isinstance(v, str) and v for v in versions.values())


def test_the_model_cards_key_follows_what_the_card_shows(tmp_path, monkeypatch):
    """Its title and settings (a changed run_name keeps the training's key), its evaluations and run link, and the
    code that writes it: a cached card is never one an older tuneline wrote."""
    from tuneline.identity import keys

    config = card_config(tmp_path)
    key = keys.model_card_key(config, "train", "base", "tuned", "run")
    assert key == keys.model_card_key(card_config(tmp_path), "train", "base", "tuned", "run")
    assert key != keys.model_card_key(card_config(tmp_path, run_name="renamed"), "train", "base", "tuned", "run")
    assert key != keys.model_card_key(config, "train", "base", "tuned-again", "run")
    assert key != keys.model_card_key(config, "train", "base", "tuned", "another-run")
    from tuneline.content import code

    plot = keys.plot_key("train")
    code.step_code_version.cache_clear()
    monkeypatch.setattr(code, "__version__", "edited")  # what an edit of the report code does to its code version
    assert keys.model_card_key(config, "train", "base", "tuned", "run") != key and keys.plot_key("train") != plot
    code.step_code_version.cache_clear()


def test_held_out_images_pair_base_and_tuned_answers_and_survive_a_missing_image(tmp_path):
    from PIL import Image

    from tuneline.report.image_answers import image_answer_rows, image_answers_section, write_image_answers

    wide = tmp_path / "wide.png"
    Image.new("RGB", (600, 300), "red").save(wide)
    gone = tmp_path / "gone.jpg"
    tuned = [{"prompt": "text row", "label": "a", "predict": "b"},
             {"prompt": "<start_of_turn>user <image>what?", "label": "a cat", "predict": "a | cat", "images": [str(wide)]},
             {"prompt": "<image>and?", "label": "x", "predict": "y", "images": [str(gone), str(wide)]}]
    base = [{**row, "predict": f"base {i}"} for i, row in enumerate(reversed(tuned))]  # matched by row, not order
    rows = image_answer_rows(base, tuned)
    assert [(row["base"], row["tuned"]) for row in rows] == [("base 1", "a | cat"), ("base 0", "y")]
    assert image_answer_rows(base, tuned, limit=1) == rows[:1]

    folder = write_image_answers(rows, tmp_path / "out")
    with Image.open(folder / "1-1.png") as thumbnail:
        assert thumbnail.size == (256, 128)
    assert not (folder / "2-1.png").exists() and (folder / "2-2.png").is_file()
    section = image_answers_section(folder)
    assert "| ![wide.png](held_out_images/1-1.png) | &lt;start_of_turn&gt;user &lt;image&gt;what? | a cat | base 1 | " \
           "a \\| cat |" in section
    assert "(gone.jpg: missing) ![wide.png](held_out_images/2-2.png)" in section
    assert write_image_answers([], tmp_path / "none") is None and image_answers_section(None) is None

    card = Path(write_model_card(card_config(tmp_path), tmp_path / "out", base_metrics={}, tuned_metrics={},
                                 dataset_fingerprints={}, plots=[], mlflow_run=None, image_answers=section)).read_text()
    assert "## Held-out images\n\nHeld-out rows with images" in card
