"""`tuneline chat`: the trained model answers through the config's template and generating keys."""

from __future__ import annotations

import io
import json

from cli.main import run
from tests.support.chat import ADD, greedy_answer, scripted_agent

QUESTION = "add two and three"


def test_one_prompt_is_answered_by_the_trained_model(trained_chat, tiny_model_dir, capsys):
    path, out = trained_chat
    assert run(["chat", str(path), "--prompt", "add two and three"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == greedy_answer(tiny_model_dir, out, "add two and three")


def test_a_conversation_on_stdin_starts_over_on_clear(trained_chat, tiny_model_dir, capsys, monkeypatch):
    path, out = trained_chat
    monkeypatch.setattr("sys.stdin", io.StringIO("hello there\nclear\nadd two and three\nexit\nnever read\n"))
    assert run(["chat", str(path)]) == 0
    answers = [line for line in capsys.readouterr().out.splitlines() if "Assistant: " in line]
    assert len(answers) == 2, "one answer per message, none after exit"
    assert answers[1].split("Assistant: ", 1)[1] == greedy_answer(tiny_model_dir, out, "add two and three"), \
        "after clear, the earlier turn is not in the prompt"


def test_without_a_trained_model_or_as_a_reward_model_it_is_refused(trained_chat, tmp_path, capsys):
    path, _ = trained_chat
    assert run(["chat", str(path), f"output_dir={tmp_path / 'nothing'}", f"mlflow_tracking_uri=sqlite:///{tmp_path}/m.db",
                 "--prompt", "hi"]) == 2
    assert "no trained model" in capsys.readouterr().err
    assert run(["chat", str(path), "stage=rm", "--prompt", "hi"]) == 2
    assert "'stage: rm'" in capsys.readouterr().err


QWEN_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
CALLS = [{"name": "add", "arguments": {"a": 2, "b": 3}}]


def test_the_tool_list_is_in_the_prompt_and_the_answers_calls_come_back_as_json(trained_chat, tiny_model_dir, tmp_path,
                                                                                  monkeypatch):
    """Prompt building, decoding and extraction are the real ones; only the generated ids are scripted (a trained
    agent's call, then the same text with no tools offered)."""
    from tuneline.config import load_config
    from tuneline.serving.chat import Chat

    path, _ = trained_chat
    prompts = scripted_agent(monkeypatch, tiny_model_dir, QWEN_CALL, QWEN_CALL)
    chat = Chat(load_config(str(path), ["template=qwen"]), tmp_path, tools=[ADD])
    said = [{"role": "user", "content": QUESTION}]
    assert chat.respond(said) == (QWEN_CALL, CALLS)
    assert "<tools>\n" + json.dumps(ADD) + "\n</tools>" in prompts[0], "qwen's tool text, the tool in it"
    assert chat.respond(said, tools=[]) == (QWEN_CALL, []), "no tools offered: the answer is text, not calls"
    assert "<tools>" not in prompts[1]


def test_the_chat_shows_the_calls_and_answers_the_typed_observation(trained_chat, tiny_model_dir, tmp_path, capsys,
                                                                   monkeypatch):
    """As above, only the generated ids are scripted: a trained agent's call, then its answer to the result."""
    path, _ = trained_chat
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


def test_a_bad_tools_file_is_one_message_naming_it(trained_chat, tmp_path, capsys):
    path, _ = trained_chat
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
