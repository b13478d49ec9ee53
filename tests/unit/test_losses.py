"""Each preference loss against a hand computation on fixed log-probs (plain `math`, not the code under test)."""

import math

import pytest
import torch

from tuneline.objectives.losses import kto_loss, pairwise_loss

# Two pairs: the first prefers chosen more than the reference does, the second less.
POLICY_C, POLICY_R = [-4.0, -6.5], [-7.0, -5.0]
REF_C, REF_R = [-5.0, -6.0], [-6.0, -5.5]
BETA = 0.1


def t(values):
    return torch.tensor(values, dtype=torch.float64)


def log_sigmoid(x):
    return -math.log1p(math.exp(-x))


def margins():
    return [(pc - pr) - (rc - rr) for pc, pr, rc, rr in zip(POLICY_C, POLICY_R, REF_C, REF_R, strict=True)]


def run(name, **kwargs):
    return pairwise_loss(name, t(POLICY_C), t(POLICY_R), t(REF_C), t(REF_R), beta=BETA, **kwargs)


def test_sigmoid_matches_dpo_formula():
    out = run("sigmoid")
    # margins: (-4+7) - (-5+6) = 2.0 ; (-6.5+5) - (-6+5.5) = -1.0
    assert margins() == [2.0, -1.0]
    expected = [-log_sigmoid(BETA * m) for m in margins()]
    assert out.losses.tolist() == pytest.approx(expected, abs=1e-12)
    assert out.chosen_rewards.tolist() == pytest.approx([BETA * 1.0, BETA * -0.5])
    assert out.rejected_rewards.tolist() == pytest.approx([BETA * -1.0, BETA * 0.5])


def test_label_smoothing_is_cdpo():
    eps = 0.2
    out = run("sigmoid", label_smoothing=eps)
    expected = [-(1 - eps) * log_sigmoid(BETA * m) - eps * log_sigmoid(-BETA * m) for m in margins()]
    assert out.losses.tolist() == pytest.approx(expected, abs=1e-12)
    assert out.losses[0] > run("sigmoid").losses[0]  # smoothing penalises confident agreement


def test_hinge():
    beta = 0.6  # large enough that the first pair clears the hinge: 1 - 0.6 * 2 < 0
    out = pairwise_loss("hinge", t(POLICY_C), t(POLICY_R), t(REF_C), t(REF_R), beta=beta)
    assert out.losses.tolist() == pytest.approx([0.0, 1 + 0.6], abs=1e-12)


def test_ipo():
    out = run("ipo")
    expected = [(m - 1 / (2 * BETA)) ** 2 for m in margins()]  # (2 - 5)^2 = 9, (-1 - 5)^2 = 36
    assert out.losses.tolist() == pytest.approx([9.0, 36.0], abs=1e-12)
    assert expected == pytest.approx([9.0, 36.0])


def test_orpo_parts_and_total():
    # ORPO works on mean per-token log-probs, which lie in (-inf, 0).
    chosen, rejected = [-0.5, -2.0], [-1.5, -1.0]
    out = pairwise_loss("orpo", t(chosen), t(rejected), beta=BETA)
    for i, (c, r) in enumerate(zip(chosen, rejected, strict=True)):
        log_odds = (c - math.log(1 - math.exp(c))) - (r - math.log(1 - math.exp(r)))
        odds_ratio = -log_sigmoid(log_odds)
        assert out.parts["sft_loss"][i].item() == pytest.approx(-c, abs=1e-12)
        assert out.parts["odds_ratio_loss"][i].item() == pytest.approx(odds_ratio, abs=1e-12)
        assert out.losses[i].item() == pytest.approx(-c + BETA * odds_ratio, abs=1e-12)
    assert out.chosen_rewards.tolist() == pytest.approx([BETA * c for c in chosen])


def test_simpo_uses_gamma_and_no_reference():
    chosen, rejected, gamma = [-0.5, -2.0], [-1.5, -1.0], 0.3
    out = pairwise_loss("simpo", t(chosen), t(rejected), beta=2.0, simpo_gamma=gamma)
    expected = [-log_sigmoid(2.0 * (c - r) - gamma) for c, r in zip(chosen, rejected, strict=True)]
    assert out.losses.tolist() == pytest.approx(expected, abs=1e-12)
    assert out.rejected_rewards.tolist() == pytest.approx([-3.0, -2.0])


def test_reference_losses_require_reference():
    with pytest.raises(ValueError, match="needs reference"):
        pairwise_loss("sigmoid", t(POLICY_C), t(POLICY_R), beta=BETA)
    with pytest.raises(ValueError, match="unknown pref_loss"):
        pairwise_loss("dpo", t(POLICY_C), t(POLICY_R), t(REF_C), t(REF_R), beta=BETA)


def test_kto_with_kl_baseline():
    chosen, ref_chosen = [-3.0, -4.0], [-4.0, -4.5]  # ratios 1.0, 0.5
    rejected, ref_rejected = [-6.0], [-5.0]  # ratio -1.0
    kl, ref_kl = [-5.0, -7.0, -6.0], [-5.5, -7.5, -6.2]  # ratios 0.5, 0.5, 0.2 -> mean 0.4
    out = kto_loss(t(chosen), t(rejected), t(kl), t(ref_chosen), t(ref_rejected), t(ref_kl),
                   beta=0.5, chosen_weight=1.0, rejected_weight=2.0)
    z = 0.4
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = [1 - sig(0.5 * (1.0 - z)), 1 - sig(0.5 * (0.5 - z)), 2.0 * (1 - sig(0.5 * (z + 1.0)))]
    assert out.losses.tolist() == pytest.approx(expected, abs=1e-12)
    assert out.parts["kl"].item() == pytest.approx(z)
    assert out.chosen_rewards.tolist() == pytest.approx([0.5, 0.25])
    assert out.rejected_rewards.tolist() == pytest.approx([-0.5])


def test_kto_kl_clamped_at_zero_and_detached():
    policy_kl = t([-8.0, -9.0]).requires_grad_()
    chosen = t([-3.0]).requires_grad_()
    out = kto_loss(chosen, t([]), policy_kl, t([-4.0]), t([]), t([-7.0, -7.0]), beta=1.0)
    assert out.parts["kl"].item() == 0.0  # mean ratio -1.5 clamps to 0
    assert out.losses.tolist() == pytest.approx([1 - 1 / (1 + math.exp(-1.0))])
    out.losses.sum().backward()
    assert policy_kl.grad is None  # no gradient through the KL baseline
    assert chosen.grad is not None
