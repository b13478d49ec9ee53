"""LLaMA-Factory's EAFT and ASFT sft losses (`use_eaft_loss`, `use_asft_loss`): the values LLaMA-Factory 0.9.5's own
functions give on the same logits (computed with it once; the numbers below), and each trains through the sft stage
as a training process runs it, resuming exactly from a checkpoint (ASFT's reference is the model before training,
also when the run resumes)."""

from __future__ import annotations

import pytest
import torch

from tests.support.sft_runs import resumed_exactly, sft_run
from tuneline.errors import ConfigError

# Logits from arithmetic, not a random generator, so that LLaMA-Factory's figures below reproduce anywhere:
# eaft_loss_func(..., None, 1.0), eaft_loss_func(..., 10, 0.5), asft_loss_func(..., alpha 0.1), (..., alpha 0.7).
LOGITS = (torch.arange(2 * 5 * 23, dtype=torch.float32).reshape(2, 5, 23) * 0.37).sin() * 3
REFERENCE = (torch.arange(2 * 5 * 23, dtype=torch.float32).reshape(2, 5, 23) * 0.23).cos() * 2
LABELS = torch.tensor([[-100, -100, 3, 4, 5], [-100, 1, 2, -100, -100]])
LLAMAFACTORY = {"eaft": 3.3620057106018066, "eaft_sum_alpha_half": 1.9454708099365234,
                "asft": 0.3109103739261627, "asft_alpha_07": 1.577800989151001}


def test_eaft_and_asft_give_llamafactorys_values():
    from tuneline.objectives.losses import asft_loss, eaft_loss

    assert eaft_loss({"logits": LOGITS}, LABELS).item() == pytest.approx(LLAMAFACTORY["eaft"], rel=1e-6)
    assert eaft_loss({"logits": LOGITS}, LABELS, num_items_in_batch=torch.tensor(10), alpha=0.5).item() == (
        pytest.approx(LLAMAFACTORY["eaft_sum_alpha_half"], rel=1e-6))
    assert asft_loss({"logits": LOGITS}, LABELS, REFERENCE, alpha=0.1).item() == pytest.approx(
        LLAMAFACTORY["asft"], rel=1e-6)
    assert asft_loss({"logits": LOGITS}, LABELS, REFERENCE, alpha=0.7).item() == pytest.approx(
        LLAMAFACTORY["asft_alpha_07"], rel=1e-6)


def test_eaft_weight_is_detached_and_asft_anchor_is_zero_against_itself():
    from tuneline.objectives.losses import asft_loss, dft_loss, eaft_loss

    logits = LOGITS.clone().requires_grad_(True)
    eaft_loss({"logits": logits}, LABELS, alpha=0.0).backward()  # weight (H/3)**0 = 1: plain cross-entropy
    plain = LOGITS.clone().requires_grad_(True)
    torch.nn.functional.cross_entropy(plain[:, :-1].reshape(-1, 23), LABELS[:, 1:].reshape(-1)).backward()
    torch.testing.assert_close(logits.grad, plain.grad)
    # against the logits themselves the KL term is zero: ASFT is then DFT averaged over the label tokens
    assert asft_loss({"logits": LOGITS}, LABELS, LOGITS, alpha=5.0).item() == pytest.approx(
        dft_loss({"logits": LOGITS}, LABELS).item(), rel=1e-6)


def test_eaft_loss_trains_with_the_entropy_weighted_loss(tiny_model_dir, tmp_path):
    _, eaft = resumed_exactly(tmp_path / "eaft", tiny_model_dir, use_eaft_loss=True, eaft_alpha=2.0)
    _, plain = sft_run(tmp_path / "plain", tiny_model_dir, tmp_path / "plain" / "out")
    assert eaft[1] != pytest.approx(plain[1]) and eaft[4] < eaft[1]


def test_asft_loss_anchors_to_the_model_before_training_also_when_resumed(tiny_model_dir, tmp_path):
    _, asft = resumed_exactly(tmp_path / "asft", tiny_model_dir, use_asft_loss=True, asft_alpha=0.5)
    _, dft = sft_run(tmp_path / "dft", tiny_model_dir, tmp_path / "dft" / "out", use_dft_loss=True)
    assert asft[1] == pytest.approx(dft[1], rel=1e-5)  # step 1: the model is its reference, the KL term is 0
    assert asft[4] > dft[4]  # afterwards the anchor adds to DFT's loss


@pytest.mark.parametrize(("keys", "refused"), [
    ({"use_eaft_loss": True, "use_dft_loss": True}, "'use_dft_loss' and 'use_eaft_loss' each choose the sft loss"),
    ({"use_asft_loss": True, "stage": "pt"}, "'use_asft_loss: True' has no effect in this run: it applies only with "
                                            "'stage: sft'"),
    ({"eaft_alpha": 2.0}, "'eaft_alpha: 2.0' has no effect in this run: it applies only with 'use_eaft_loss: true'"),
    ({"use_asft_loss": True, "deepspeed": "<zero3>"}, "'use_asft_loss: true' keeps a frozen copy of the model"),
])
def test_loss_keys_are_refused_where_they_cannot_act(tiny_model_dir, tmp_path, keys, refused):
    import json

    from tests.support.sft_runs import sft_config

    zero3 = tmp_path / "zero3.json"
    zero3.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    keys = {k: str(zero3) if v == "<zero3>" else v for k, v in keys.items()}
    with pytest.raises(ConfigError, match=refused.replace("(", r"\(").replace(")", r"\)")):
        sft_config(tmp_path, tiny_model_dir, tmp_path / "out", **keys)
