"""`tuneline chat`: the trained model answers through the config's template and generating keys."""

from __future__ import annotations

import io
import json

import pytest
import yaml
from test_export import make_adapter

from flows.cli import run

QUESTION = "add two and three"
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
    assert run(["chat", str(path), "--prompt", "add two and three"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == greedy_answer(tiny_model_dir, out, "add two and three")


def test_a_conversation_on_stdin_starts_over_on_clear(trained, tiny_model_dir, capsys, monkeypatch):
    path, out = trained
    monkeypatch.setattr("sys.stdin", io.StringIO("hello there\nclear\nadd two and three\nexit\nnever read\n"))
    assert run(["chat", str(path)]) == 0
    answers = [line for line in capsys.readouterr().out.splitlines() if "Assistant: " in line]
    assert len(answers) == 2, "one answer per message, none after exit"
    assert answers[1].split("Assistant: ", 1)[1] == greedy_answer(tiny_model_dir, out, "add two and three"), \
        "after clear, the earlier turn is not in the prompt"


def test_without_a_trained_model_or_as_a_reward_model_it_is_refused(trained, tmp_path, capsys):
    path, _ = trained
    assert run(["chat", str(path), f"output_dir={tmp_path / 'nothing'}", f"mlflow_tracking_uri=sqlite:///{tmp_path}/m.db",
                 "--prompt", "hi"]) == 2
    assert "no trained model" in capsys.readouterr().err
    assert run(["chat", str(path), "stage=rm", "--prompt", "hi"]) == 2
    assert "'stage: rm'" in capsys.readouterr().err


ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
QWEN_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
CALLS = [{"name": "add", "arguments": {"a": 2, "b": 3}}]


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


def test_the_tool_list_is_in_the_prompt_and_the_answers_calls_come_back_as_json(trained, tiny_model_dir, tmp_path,
                                                                                  monkeypatch):
    """Prompt building, decoding and extraction are the real ones; only the generated ids are scripted (a trained
    agent's call, then the same text with no tools offered)."""
    from tuneline.chat import Chat
    from tuneline.config import load_config

    path, _ = trained
    prompts = scripted_agent(monkeypatch, tiny_model_dir, QWEN_CALL, QWEN_CALL)
    chat = Chat(load_config(str(path), ["template=qwen"]), tmp_path, tools=[ADD])
    said = [{"role": "user", "content": QUESTION}]
    assert chat.respond(said) == (QWEN_CALL, CALLS)
    assert "<tools>\n" + json.dumps(ADD) + "\n</tools>" in prompts[0], "qwen's tool text, the tool in it"
    assert chat.respond(said, tools=[]) == (QWEN_CALL, []), "no tools offered: the answer is text, not calls"
    assert "<tools>" not in prompts[1]


def test_the_chat_shows_the_calls_and_answers_the_typed_observation(trained, tiny_model_dir, tmp_path, capsys,
                                                                   monkeypatch):
    """As above, only the generated ids are scripted: a trained agent's call, then its answer to the result."""
    path, _ = trained
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([ADD["function"]]))  # a plain spec, as LLaMA-Factory's data holds them
    prompts = scripted_agent(monkeypatch, tiny_model_dir, QWEN_CALL, "It is 5.")
    monkeypatch.setattr("sys.stdin", io.StringIO(f'{QUESTION}\n{{"sum": 5}}\nexit\n'))
    assert run(["chat", str(path), "template=qwen", "--tools", str(tools)]) == 0
    out = capsys.readouterr().out
    assert f"Tool calls: {json.dumps(CALLS)}\n" in out and "Observation: Assistant: It is 5.\n" in out
    assert ("<|im_start|>assistant\n" + QWEN_CALL + "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
            '{"sum": 5}\n</tool_response><|im_end|>\n<|im_start|>assistant\n') in prompts[1], \
        "the calls went back as a function message, the typed result as an observation"

    scripted_agent(monkeypatch, tiny_model_dir, QWEN_CALL)
    assert run(["chat", str(path), "template=qwen", "--tools", str(tools), "--prompt", QUESTION]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"Tool calls: {json.dumps(CALLS)}", "one prompt: its calls"


def test_a_bad_tools_file_is_one_message_naming_it(trained, tmp_path, capsys):
    path, _ = trained
    cases = {"missing.json": (None, "No such file or directory"),
             "empty.json": ("", "the file is empty"),
             "broken.json": ("[{", "the tool list is not JSON"),
             "object.json": (json.dumps(ADD), "must be a JSON list of tool objects, got dict"),
             "nameless.json": ('[{"description": "adds"}]', "tool 1 of the list must be an object with a 'name'"),
             "unwritable.json": ('[{"name": "add", "parameters": "two numbers"}]',
                                 "the 'chatml' template cannot write it")}  # chatml writes tools ReAct-style
    for name, (text, expected) in cases.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        assert run(["chat", str(path), "--tools", str(tmp_path / name), "--prompt", "hi"]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith(f"error: cannot use the tool list: {tmp_path / name}: ") and expected in err, err
        assert "Traceback" not in err
