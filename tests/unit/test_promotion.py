"""The retrain flow's promotion rule, alone: direction, minimum gain, ties, a first version."""

from tuneline.pipeline.promotion import decide


def test_a_version_is_promoted_only_when_it_beats_the_champion_by_the_minimum_gain():
    assert decide("eval_loss", 1.0, None, False, 0.0).promote, "the first version becomes champion"
    assert decide("eval_loss", 0.9, 1.0, False, 0.05).promote
    assert not decide("eval_loss", 0.97, 1.0, False, 0.05).promote, "better, but by less than min_delta"
    assert not decide("eval_loss", 1.0, 1.0, False, 0.0).promote, "a tie keeps the champion"
    assert decide("accuracy", 0.8, 0.7, True, 0.0).promote and not decide("accuracy", 0.6, 0.7, True, 0.0).promote
    missing = decide("accuracy", None, 0.7, True, 0.0)
    assert not missing.promote and "no 'accuracy'" in missing.reason
    assert "0.97" in decide("eval_loss", 0.97, 1.0, False, 0.05).reason

