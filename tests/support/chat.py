"""What the chat and serving tests share: a finished LoRA training to chat with, the answer the model gives
without tuneline (greedy, chatml written out by hand), and a scripted generation step for tool calls."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.support.model_steps import make_adapter

PROMPT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"  # chatml, written out by hand


@pytest.fixture(scope="module")
def trained_chat(tiny_model_dir, demo_data_dir, tmp_path_factory):
    """A config whose output_dir holds a finished LoRA training (a random adapter stands for the trained one)."""
    root = tmp_path_factory.mktemp("chat")
    out = make_adapter(tiny_model_dir, root / "out", seed=3, targets=("q_proj", "v_proj", "down_proj"))
    (out / "run.json").write_text(json.dumps({"status": "complete"}))
    config = {"model_name_or_path": str(tiny_model_dir), "stage": "sft", "dataset": "demo_sft",
              "dataset_dir": str(demo_data_dir), "template": "chatml", "output_dir": str(out), "do_sample": False,
              "max_new_tokens": 6}
    path = root / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, out


def greedy_answer(tiny_model_dir, adapter, text: str) -> str:
    """Base + adapter, the chatml prompt, greedy decoding to im_end: computed without tuneline."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(adapter)).eval()
    ids = torch.tensor([tokenizer(PROMPT.format(text), add_special_tokens=False)["input_ids"]])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6,
                             eos_token_id=end, pad_token_id=tokenizer.pad_token_id)
    answer = out[0, ids.shape[1]:].tolist()
    return tokenizer.decode(answer[:answer.index(end)] if end in answer else answer, skip_special_tokens=True).strip()


ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


def scripted_agent(monkeypatch, tiny_model_dir, *answers: str) -> list[str]:
    """Replaces only the generation step: each call answers with the token ids of the next scripted text, as a
    trained agent would (the tiny model's random weights call no tool). Returns the prompts it is given, decoded."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts: list[str] = []
    queue = list(answers)

    def generate(model, batch, settings, pad_id, eos_ids, batch_size, row_inputs=None):
        prompts.extend(tokenizer.decode(ids) for ids in batch)
        return [tokenizer(queue.pop(0), add_special_tokens=False)["input_ids"] for _ in batch]

    monkeypatch.setattr("tuneline.evaluation.generation.generate_batches", generate)
    return prompts
