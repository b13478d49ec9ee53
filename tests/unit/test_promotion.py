"""The retrain flow's promotion rule, alone: direction, minimum gain, ties, a first version."""

from pathlib import Path

import pytest

from tuneline.pipeline.promotion import decide

REPO = Path(__file__).resolve().parents[2]


def test_a_version_is_promoted_only_when_it_beats_the_champion_by_the_minimum_gain():
    assert decide("eval_loss", 1.0, None, False, 0.0).promote, "the first version becomes champion"
    assert decide("eval_loss", 0.9, 1.0, False, 0.05).promote
    assert not decide("eval_loss", 0.97, 1.0, False, 0.05).promote, "better, but by less than min_delta"
    assert not decide("eval_loss", 1.0, 1.0, False, 0.0).promote, "a tie keeps the champion"
    assert decide("accuracy", 0.8, 0.7, True, 0.0).promote and not decide("accuracy", 0.6, 0.7, True, 0.0).promote
    missing = decide("accuracy", None, 0.7, True, 0.0)
    assert not missing.promote and "no 'accuracy'" in missing.reason
    assert "0.97" in decide("eval_loss", 0.97, 1.0, False, 0.05).reason


@pytest.mark.parametrize(("metric", "message"), [
    ("exact_matc", "does not produce it; did you mean 'exact_match'"),
    ("train_loss", "the training loss is not measured"),
    ("reward_accuracy", "the sft evaluation does not produce it"),
])
def test_a_promotion_metric_the_evaluation_never_reports_is_refused_before_training(capsys, tmp_path, monkeypatch,
                                                                                    metric, message):
    from flows.cli import main

    monkeypatch.chdir(REPO)
    store = tmp_path / "mlflow.db"
    argv = ["retrain", "examples/sft_lora_demo.yaml", "demo-model", f"mlflow_tracking_uri=sqlite:///{store}",
            f"output_dir={tmp_path / 'out'}", "--metric", metric]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"promotion metric {metric}" in err and message in err and "Traceback" not in err, err
    assert not store.exists(), "refused before any run was recorded"
