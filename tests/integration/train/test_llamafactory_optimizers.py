"""LLaMA-Factory's other optimizers, precision and methods (GaLore, APOLLO, Adam-mini, Muon, pure_bf16, OFT, DFT)
through the sft stage as a training process runs it, on the tiny model: the optimizer each key asks for is the one
that trains, and a run resumed from a checkpoint continues exactly as the uninterrupted run (optimizer state, the
learning-rate schedule and the weights)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests.support.sft_runs import SeenOptimizer, final_weights, resumed_exactly, sft_config, sft_run  # noqa: F401
from tuneline.errors import ConfigError

DATA = Path(__file__).resolve().parents[3] / "data"


@pytest.mark.parametrize("layerwise", [False, True])
@pytest.mark.parametrize("method", ["galore", "apollo"])
def test_galore_and_apollo_train_their_target_weights_and_resume_exactly(tiny_model_dir, tmp_path, method, layerwise):
    from tuneline.model.low_rank_optimizers import LayerwiseOptimizer

    keys = {f"use_{method}": True, f"{method}_layerwise": layerwise, f"{method}_rank": 4,
            f"{method}_update_interval": 2, f"{method}_target": "mlp,self_attn"}
    optimizer, losses = resumed_exactly(tmp_path, tiny_model_dir, **keys)
    if method == "galore":
        from galore_torch import GaLoreAdamW as expected
    else:
        from apollo_torch import APOLLOAdamW as expected
    inner = optimizer.optimizers if layerwise else [optimizer]
    assert isinstance(optimizer, LayerwiseOptimizer) == layerwise
    assert {type(o) for o in inner} == {expected}
    ranks = [g["rank"] for o in inner for g in o.param_groups if "rank" in g]
    assert ranks and set(ranks) == {4}  # the target Linear weights, projected at galore_rank / apollo_rank
    assert all(p.ndim == 2 for o in inner for g in o.param_groups if "rank" in g for p in g["params"])
    assert losses[4] < losses[1]


def test_adam_mini_and_muon_train_and_resume_exactly(tiny_model_dir, tmp_path):
    adam_mini, _ = resumed_exactly(tmp_path / "adam_mini", tiny_model_dir, use_adam_mini=True)
    assert type(adam_mini).__name__ == "Adam_mini"
    muon, losses = resumed_exactly(tmp_path / "muon", tiny_model_dir, use_muon=True)
    assert [type(o).__name__ for o in muon.optimizers] == ["Muon", "AdamW"]
    assert all(p.ndim == 2 for g in muon.optimizers[0].param_groups for p in g["params"])
    assert muon.optimizers[0].param_groups[0]["adjust_lr_fn"] == "match_rms_adamw"
    assert losses[4] < losses[1]


def test_oft_trains_an_orthogonal_adapter_and_resumes_exactly(tiny_model_dir, tmp_path):
    resumed_exactly(tmp_path, tiny_model_dir, finetuning_type="oft", oft_block_size=8, learning_rate=1e-3)
    saved = json.loads((tmp_path / "whole" / "adapter_config.json").read_text())
    assert saved["peft_type"] == "OFT" and saved["oft_block_size"] == 8
    assert {"q_proj", "down_proj"} <= set(saved["target_modules"])  # oft_target: all
    assert not (tmp_path / "whole" / "model.safetensors").exists()


def test_pure_bf16_trains_bf16_weights_and_resumes_exactly(tiny_model_dir, tmp_path):
    resumed_exactly(tmp_path, tiny_model_dir, pure_bf16=True, use_galore=True, galore_layerwise=True, galore_rank=4)
    assert {t.dtype for t in final_weights(tmp_path / "whole").values()} == {torch.bfloat16}


def test_dft_loss_trains_with_the_probability_weighted_loss(tiny_model_dir, tmp_path):
    _, dft = resumed_exactly(tmp_path / "dft", tiny_model_dir, use_dft_loss=True)
    _, plain = sft_run(tmp_path / "plain", tiny_model_dir, tmp_path / "plain" / "out")
    assert all(dft[s] < plain[s] for s in dft)  # each token's loss weighted by its probability (below 1)


def test_dft_loss_weights_each_label_token_by_its_detached_probability():
    from tuneline.objectives.losses import dft_loss

    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=True)
    labels = torch.tensor([[-100, -100, 3, 4, 5], [-100, 1, 2, -100, -100]])
    loss = dft_loss({"logits": logits}, labels)
    # By hand: position t predicts labels[t + 1]; probability p of the right token; loss = mean(-log p * p).
    terms = [(b, t) for b in range(2) for t in range(4) if labels[b, t + 1] != -100]
    probs = torch.stack([logits[b, t].softmax(-1)[labels[b, t + 1]] for b, t in terms])
    assert loss.item() == pytest.approx((-probs.log() * probs).mean().item(), rel=1e-6)
    assert dft_loss({"logits": logits}, labels, num_items_in_batch=10).item() == pytest.approx(
        (-probs.log() * probs).sum().item() / 10, rel=1e-6)
    loss.backward()  # the weight is detached: the gradient is p * d(-log p), not d(-p log p)
    logit_grad = logits.grad[0, 1, 3].item()
    p = probs[0].item()
    assert logit_grad == pytest.approx(-(1 - p) * p / len(terms), rel=1e-4)


@pytest.mark.parametrize(("keys", "refused"), [
    ({"use_galore": True, "use_apollo": True}, "'use_galore' and 'use_apollo' each choose the optimizer"),
    ({"use_muon": True, "use_badam": True}, "'use_badam' and 'use_muon' each choose the optimizer"),
    ({"use_galore": True, "finetuning_type": "lora"}, "'use_galore: true' projects the gradients of full weights"),
    ({"use_apollo": True, "apollo_layerwise": True, "gradient_accumulation_steps": 2},
     "'apollo_layerwise: true' updates each weight as soon as its gradient is ready"),
    ({"use_galore": True, "galore_layerwise": True, "num_processes": 2}, "'galore_layerwise: true' runs in one process"),
    ({"galore_rank": 4}, "'galore_rank: 4' has no effect in this run: it applies only with 'use_galore: true'"),
    ({"oft_block_size": 8}, "'oft_block_size: 8' has no effect in this run: it applies only with 'finetuning_type: oft'"),
    ({"finetuning_type": "oft", "oft_rank": 4}, "'oft_rank: 4' and 'oft_block_size: 32' are both set"),
    ({"use_dft_loss": True, "stage": "pt"}, "'use_dft_loss: True' has no effect in this run: it applies only with "
                                            "'stage: sft'"),
    ({"pure_bf16": True, "fp16": True}, "'pure_bf16: true' trains in bf16; it conflicts with 'fp16: true'"),
])
def test_what_these_keys_cannot_do_is_refused_before_a_run(tiny_model_dir, tmp_path, keys, refused):
    with pytest.raises(ConfigError) as raised:
        sft_config(tmp_path, tiny_model_dir, tmp_path / "out", **keys)
    assert refused in str(raised.value)


@pytest.mark.parametrize(("key", "refused"), [("use_galore", "'use_galore: true' does not run under DeepSpeed"),
                                              ("use_apollo", "'use_apollo: true' does not run under DeepSpeed"),
                                              ("use_muon", "'use_muon: true' orthogonalizes whole 2-D weights")])
def test_what_deepspeed_cannot_serve_is_refused(tiny_model_dir, tmp_path, key, refused):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}))
    with pytest.raises(ConfigError, match=re.escape(refused)):
        sft_config(tmp_path, tiny_model_dir, tmp_path / "out", **{key: True}, deepspeed=str(ds))


def test_a_missing_optimizer_package_is_refused_naming_what_to_install(tiny_model_dir, tmp_path, monkeypatch):
    """Stands in for a machine without galore-torch: the check asks importlib, told here the package is absent."""
    from tuneline.runtime import requirements

    monkeypatch.setattr(requirements, "installed", lambda name: name != "galore_torch")
    config = sft_config(tmp_path, tiny_model_dir, tmp_path / "out", use_galore=True)
    [problem] = requirements.missing_requirements(config, cuda=False)
    assert problem.startswith("'use_galore: true' needs the galore-torch package: `pip install -e '.[galore]'`")


@pytest.mark.parametrize("keys", [{"use_galore": True, "galore_layerwise": True, "galore_rank": 4},
                                  {"use_muon": True}], ids=["galore_layerwise", "muon"])
def test_a_killed_training_resumes_with_the_optimizer_state_exactly(tiny_model_dir, tmp_path, keys):
    """`python -m tuneline.train` SIGKILLed once a checkpoint is complete, then launched again: it resumes there and
    ends with the losses and weights of a run nobody interrupted."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    from tuneline.data import build_dataset
    from tuneline.train.checkpoints import checkpoint_step, complete_checkpoints

    settings = {**keys, "max_steps": 8, "save_steps": 2, "lr_scheduler_type": "linear"}
    dataset = build_dataset(sft_config(tmp_path, tiny_model_dir, tmp_path / "unused", **settings))
    commands = {}
    for name in ("reference", "killed"):
        values = {**sft_config(tmp_path, tiny_model_dir, tmp_path / name, **settings).flat(),
                  "output_dir": str(tmp_path / name)}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({k: v for k, v in values.items() if v is not None}))
        commands[name] = [sys.executable, "-m", "tuneline.train", str(tmp_path / f"{name}.yaml"), "--dataset",
                          dataset["path"]]
    victim = subprocess.Popen(commands["killed"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while victim.poll() is None and not complete_checkpoints(tmp_path / "killed"):
        time.sleep(0.02)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    killed_at = checkpoint_step(complete_checkpoints(tmp_path / "killed")[-1])
    assert killed_at < 8, "killed too late to test resume"
    for name in ("killed", "reference"):
        done = subprocess.run(commands[name], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    logs = {name: {e["current_steps"]: e["loss"] for e in map(json.loads, (tmp_path / name / "trainer_log.jsonl")
                                                              .read_text().splitlines()) if "loss" in e}
            for name in ("reference", "killed")}
    assert sorted(logs["killed"]) == sorted(logs["reference"]) == list(range(1, 9))
    for step in range(killed_at + 1, 9):
        assert logs["killed"][step] == pytest.approx(logs["reference"][step], rel=1e-6, abs=1e-7), step
    reference, killed = final_weights(tmp_path / "reference"), final_weights(tmp_path / "killed")
    for name, tensor in reference.items():
        torch.testing.assert_close(killed[name], tensor, rtol=0, atol=0, msg=name)
