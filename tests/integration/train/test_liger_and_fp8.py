"""liger-kernel (`enable_liger_kernel`) and FP8 (`fp8` and its keys) need a CUDA GPU: on this machine, which has
none, they are refused before anything starts, naming why; the code that hands them to transformers (the Trainer's
`use_liger_kernel`, with LLaMA-Factory's choice of cross-entropy kernel) and to accelerate (its launcher's FP8
flags, and the TrainingArguments that leave precision to them) is checked up to where a GPU would take over."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuneline.config import load_config
from tuneline.errors import ConfigError

DATA = Path(__file__).resolve().parents[3] / "data"


def _values(tiny_model_dir, tmp_path, **keys) -> dict:
    return {"model_name_or_path": str(tiny_model_dir), "dataset": "demo_sft", "dataset_dir": str(DATA),
            "output_dir": str(tmp_path / "out"), **keys}


def test_without_a_gpu_both_are_refused_before_start_naming_why(tiny_model_dir, tmp_path):
    from tuneline.pipeline.preflight import checked_config
    from tuneline.runtime.devices import gpu_count

    assert gpu_count() == 0  # this test is about a machine without CUDA
    with pytest.raises(ConfigError) as caught:
        checked_config(None, _values(tiny_model_dir, tmp_path, enable_liger_kernel=True, fp8=True, fp8_backend="te"))
    text = str(caught.value)
    assert "'enable_liger_kernel: true' runs liger-kernel's Triton kernels, which run on a CUDA GPU only" in text
    assert "'fp8: true' trains with FP8 matrix multiplies, which need a CUDA GPU with FP8 tensor cores" in text


@pytest.mark.parametrize(("keys", "kernels"), [
    ({}, None),  # sft's own loss: the fused linear cross-entropy, which never makes the logits
    ({"use_dft_loss": True}, {"fused_linear_cross_entropy": False, "cross_entropy": True}),
    ({"stage": "dpo", "dataset": "demo_pref"}, {"fused_linear_cross_entropy": False, "cross_entropy": True}),
])
def test_liger_is_handed_to_the_trainer_with_llamafactorys_cross_entropy_choice(tiny_model_dir, tmp_path, keys,
                                                                                 kernels):
    from tuneline.train.training_args import build_training_args

    args = build_training_args(load_config(None, _values(tiny_model_dir, tmp_path, enable_liger_kernel=True, **keys)))
    assert args.use_liger_kernel and args.liger_kernel_config == kernels
    assert not build_training_args(load_config(None, _values(tiny_model_dir, tmp_path, **keys))).use_liger_kernel


def test_fp8_is_launched_through_accelerates_fp8_flags(tiny_model_dir, tmp_path, monkeypatch):
    from tuneline.pipeline.launch import launcher
    from tuneline.train.training_args import build_training_args

    config = load_config(None, _values(tiny_model_dir, tmp_path, fp8=True, fp8_backend="torchao",
                                       fp8_enable_fsdp_float8_all_gather=True, bf16=True))
    command = " ".join(launcher(config))
    assert "--mixed_precision fp8 --fp8_backend ao --fp8_enable_fsdp_float8_all_gather true" in command
    assert "--mixed_precision no" in " ".join(launcher(load_config(None, _values(tiny_model_dir, tmp_path))))
    with pytest.raises(ConfigError, match="'fp8: true' is set up by the launcher"):
        build_training_args(config)  # started some other way, nothing would train in FP8
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp8")  # what that launch sets in the training process
    args = build_training_args(config)
    assert args.mixed_precision == "fp8" and not args.bf16  # transformers hands accelerate fp8, not bf16


def test_fp8_keys_without_fp8_and_either_under_ppo_are_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="'fp8_backend: te' has no effect in this run: it applies only with 'fp8: "
                                          "true'"):
        load_config(None, _values(tiny_model_dir, tmp_path, fp8_backend="te"))
    with pytest.raises(ConfigError, match="'enable_liger_kernel: true' is not run by 'stage: ppo'"):
        load_config(None, _values(tiny_model_dir, tmp_path, stage="ppo", reward_model=str(tiny_model_dir),
                                  enable_liger_kernel=True), check_paths=False)
