"""LLaMA-Factory 0.9.5's example configs and demo data (tests/fixtures/llamafactory/0.9.5), for the tests that run
them unchanged (tests/acceptance) and those that check them or see them refused before a run (tests/e2e): which
examples train and what each leaves, a checkout to run them in, and `tuneline train` run as its users run it."""

import json
import shutil
from pathlib import Path

import pytest

LLAMAFACTORY = Path(__file__).resolve().parents[1] / "fixtures" / "llamafactory" / "0.9.5"


TRAINED = {  # example -> the file a finished training leaves in output_dir
    "examples/train_lora/qwen3_lora_sft.yaml": "adapter_model.safetensors",
    "examples/train_lora/qwen3_lora_pretrain.yaml": "adapter_model.safetensors",
    "examples/train_lora/qwen3_lora_reward.yaml": "adapter_model.safetensors",
    "examples/train_lora/qwen3_lora_dpo.yaml": "adapter_model.safetensors",
    "examples/train_lora/qwen3_lora_kto.yaml": "adapter_model.safetensors",
    "examples/train_full/qwen3_full_sft.yaml": "model.safetensors",
    "examples/extras/loraplus/llama3_lora_sft.yaml": "adapter_model.safetensors",
    "examples/extras/pissa/llama3_lora_sft.yaml": "adapter_model.safetensors",
    # optimizers, precision and methods beside AdamW and LoRA (the GaLore one is the revision of LLaMA-Factory's
    # repository stored for that path, which sets the same keys as 0.9.5's with older spellings beside them)
    "examples/extras/galore/llama3_full_sft.yaml": "model.safetensors",
    "examples/extras/apollo/llama3_full_sft.yaml": "model.safetensors",
    "examples/extras/adam_mini/qwen2_full_sft.yaml": "model.safetensors",
    "examples/extras/muon/qwen2_full_sft.yaml": "model.safetensors",
    "examples/extras/oft/llama3_oft_sft.yaml": "adapter_model.safetensors",
    "examples/extras/dft/qwen2_full_sft.yaml": "model.safetensors",
}


# Examples that hold out a validation split (val_size): the flow evaluates the model before and after on it.
VALIDATED = {"examples/extras/galore/llama3_full_sft.yaml", "examples/extras/apollo/llama3_full_sft.yaml",
             "examples/extras/adam_mini/qwen2_full_sft.yaml"}


STEPS = 2
RAY_EXAMPLE = "examples/train_lora/qwen3_lora_sft_ray.yaml"
# The tiny model's tokenizer is ChatML's: llama3's stop words are not tokens of it, so the llama3 examples add them,
# as the refusal of a template whose stop words a tokenizer lacks says to.
LLAMA3_TOKENS = "add_special_tokens=<|eot_id|>,<|eom_id|>"


def tiny_model_overrides(example: str, tiny_model_dir) -> list[str]:
    return [f"model_name_or_path={tiny_model_dir}", *([LLAMA3_TOKENS] if "/llama3_" in example else [])]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A copy of the LLaMA-Factory files, so runs write their outputs, caches and MLflow store there."""
    root = tmp_path_factory.mktemp("llamafactory")
    shutil.copytree(LLAMAFACTORY, root, dirs_exist_ok=True)
    return root


def train(checkout, example, *overrides):
    """`tuneline train EXAMPLE key=value ...` in the checkout; the flow's result."""
    import contextlib
    import io

    from cli.main import run

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert run(["train", example, *overrides]) == 0
    return json.loads(printed.getvalue()[printed.getvalue().index("{"):])


# LLaMA-Factory's Qwen3-VL examples (its data: mllm_demo, identity, alpaca_en_demo; rlhf_v from its local copy), on a
# tiny Qwen3-VL with the examples' own template, and on tiny gemma3 and llava with theirs. Without torchvision (here)
# the Qwen3-VL run gets its processor's image half (tuneline.model.image_only_processor).
VISION_TRAINED = {
    "examples/train_lora/qwen3vl_lora_sft.yaml": "adapter_model.safetensors",
    "examples/train_full/qwen3vl_full_sft.yaml": "model.safetensors",
    "examples/train_lora/qwen3vl_lora_dpo.yaml": "adapter_model.safetensors",
}


RLHF_V_PAIRS = Path(__file__).resolve().parents[1] / "fixtures" / "llamafactory-mm" / "rlhf_v_demo.json"


def local_rlhf_v(checkout: Path) -> Path:
    """A data dir as a LLaMA-Factory user with the hub dataset `llamafactory/RLHF-V` on disk has it: LLaMA-Factory's
    dataset_info.json unchanged (its `rlhf_v` entry names the hub id), the rows under data/llamafactory/RLHF-V/, the
    images they name beside them."""
    data = checkout / "data-rlhf-v"
    if not data.exists():
        shutil.copytree(checkout / "data" / "mllm_demo_data", data / "mllm_demo_data")
        shutil.copy(checkout / "data" / "dataset_info.json", data)
        (data / "llamafactory" / "RLHF-V").mkdir(parents=True)
        shutil.copy(RLHF_V_PAIRS, data / "llamafactory" / "RLHF-V")
    return data
