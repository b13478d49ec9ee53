"""`tuneline chat`: the trained model answers through the config's template and generating keys."""

from __future__ import annotations

import io
import json

import pytest
import yaml
from test_export import make_adapter

from flows.cli import main

PROMPT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"  # chatml, written out by hand


@pytest.fixture(scope="module")
def trained(tiny_model_dir, demo_data_dir, tmp_path_factory):
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


def test_one_prompt_is_answered_by_the_trained_model(trained, tiny_model_dir, capsys):
    path, out = trained
    assert main(["chat", str(path), "--prompt", "add two and three"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == greedy_answer(tiny_model_dir, out, "add two and three")


def test_a_conversation_on_stdin_starts_over_on_clear(trained, tiny_model_dir, capsys, monkeypatch):
    path, out = trained
    monkeypatch.setattr("sys.stdin", io.StringIO("hello there\nclear\nadd two and three\nexit\nnever read\n"))
    assert main(["chat", str(path)]) == 0
    answers = [line for line in capsys.readouterr().out.splitlines() if "Assistant: " in line]
    assert len(answers) == 2, "one answer per message, none after exit"
    assert answers[1].split("Assistant: ", 1)[1] == greedy_answer(tiny_model_dir, out, "add two and three"), \
        "after clear, the earlier turn is not in the prompt"


def test_without_a_trained_model_or_as_a_reward_model_it_is_refused(trained, tmp_path, capsys):
    path, _ = trained
    assert main(["chat", str(path), f"output_dir={tmp_path / 'nothing'}", f"mlflow_tracking_uri=sqlite:///{tmp_path}/m.db",
                 "--prompt", "hi"]) == 2
    assert "no trained model" in capsys.readouterr().err
    assert main(["chat", str(path), "stage=rm", "--prompt", "hi"]) == 2
    assert "'stage: rm'" in capsys.readouterr().err
