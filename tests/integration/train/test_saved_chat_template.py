"""The tokenizer a training saves into output_dir and its checkpoints speaks the template the run trained on: users
load and serve those folders directly (`vllm serve out --enable-lora`, `AutoTokenizer.from_pretrained(out)`), and a
server formats prompts with the tokenizer's chat_template alone. The tiny model's own chat template is ChatML."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.ppo import ppo_config
from tests.support.training import REPO_ROOT

DEMO_ROW = json.loads((REPO_ROOT / "data" / "demo_sft.json").read_text())[0]


def _train(tiny_model_dir, tmp_path, template: str):
    from tuneline.config import load_config
    from tuneline.data import build_dataset, load_processed
    from tuneline.train import sft

    values = {"model_name_or_path": str(tiny_model_dir), "dataset": "demo_sft", "dataset_dir": str(REPO_ROOT / "data"),
              "template": template, "max_samples": 8, "output_dir": str(tmp_path / "out"),
              "pipeline_cache_dir": str(tmp_path / "cache"), "per_device_train_batch_size": 4, "max_steps": 2,
              "save_steps": 2, "lora_rank": 4, "seed": 0, "logging_steps": 1, "dataloader_num_workers": 0}
    config = load_config(None, values)
    ref = build_dataset(config)
    sft.run(config, ref, [])
    return tmp_path / "out", load_processed(ref)["train"]


MESSAGES = [{"role": "user", "content": f"{DEMO_ROW['instruction']}\n{DEMO_ROW['input']}"}]


def test_a_llama3_run_on_a_chatml_base_saves_a_tokenizer_that_renders_as_trained(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    out, rows = _train(tiny_model_dir, tmp_path, "llama3")
    messages = MESSAGES
    base = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert "<|im_start|>" in base.apply_chat_template(messages, tokenize=False)
    trained_prompts = {tuple(ids[:next(i for i, label in enumerate(labels) if label != -100)])
                       for ids, labels in zip(rows["input_ids"], rows["labels"], strict=True)}
    for folder in (out, out / "checkpoint-2"):
        saved = AutoTokenizer.from_pretrained(folder)
        prompt = saved.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert prompt.startswith(saved.bos_token + "<|start_header_id|>user<|end_header_id|>\n\n"), folder
        assert tuple(saved(prompt, add_special_tokens=False)["input_ids"]) in trained_prompts, folder


def test_ppo_saves_its_policy_with_the_trained_template(tiny_model_dir, reward_model_dir, tmp_path):  # noqa: F811
    """ppo saves the policy with its own loop (not the Trainer's save), into output_dir and its checkpoints."""
    from transformers import AutoTokenizer

    from tuneline.data import build_dataset
    from tuneline.train.ppo import run

    config = ppo_config(tiny_model_dir, reward_model_dir, tmp_path, template="llama3", max_steps=2,
                        save_strategy="steps", save_steps=2, val_size=0, eval_strategy="no")
    out = Path(run(config, build_dataset(config), [])["output_dir"])
    for folder in (out, out / "checkpoint-2"):
        prompt = AutoTokenizer.from_pretrained(folder).apply_chat_template(MESSAGES, tokenize=False,
                                                                           add_generation_prompt=True)
        assert prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n") and "<|im_start|>" not in prompt
