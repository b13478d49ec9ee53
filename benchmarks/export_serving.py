"""An export served by `transformers serve` answers as `tuneline chat` does: `python benchmarks/export_serving.py
[--template llama3]  [--max-tokens 12]`.

Builds the tiny model (its tokenizer speaks ChatML), puts a random LoRA adapter in a finished output_dir trained with
`--template`, exports it with `tuneline export`, starts `transformers serve EXPORT --device cpu` and sends each
conversation (one question; several turns; a tool list, a call and its result) through the OpenAI client (greedy:
temperature 0) and through `tuneline chat`'s `Chat`. Prints per conversation whether the answers agree, and the server's start time and seconds per answer against the chat's. Figures only; needs
`openai` (transformers[serving])."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
# (label, tuneline messages, tools): one question, several turns, and a tool round with its result
CONVERSATIONS = (
    ("one question", [{"role": "user", "content": "add two and three"}], None),
    ("several turns", [{"role": "user", "content": "What is the capital of France?"},
                       {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Spain?"}], None),
    ("tools and a result", [{"role": "user", "content": "Weather in Paris?"}, {"role": "function", "content": CALL},
                            {"role": "observation", "content": '{"temperature": 18}'}], TOOLS),
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def trained_config(root: Path, template: str, max_tokens: int) -> Path:
    """A config whose output_dir holds a finished LoRA training on the tiny model (a random adapter stands for it)."""
    import torch
    import yaml
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tuneline.demo.tiny_model import TINY_PRESETS, build_tiny_model

    base = build_tiny_model(root / "base", **TINY_PRESETS["test"])
    torch.manual_seed(7)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), lora).save_pretrained(str(root / "out"))
    (root / "out" / "run.json").write_text(json.dumps({"status": "complete"}))
    config = {"model_name_or_path": str(base), "stage": "sft", "dataset": "demo_sft", "dataset_dir": str(REPO / "data"),
              "template": template, "output_dir": str(root / "out"), "export_dir": str(root / "export"),
              "do_sample": False, "max_new_tokens": max_tokens, "skip_special_tokens": True}
    path = root / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def serve(export: Path, port: int) -> tuple[subprocess.Popen, float]:
    """`transformers serve` on the export, and the seconds until it lists its model."""
    import urllib.request

    start = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "transformers.cli.transformers", "serve", str(export), "--device",
                               "cpu", "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while time.perf_counter() - start < 180:
        if server.poll() is not None:
            raise SystemExit(f"transformers serve exited: {server.stderr.read()[-2000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
            return server, time.perf_counter() - start
        except OSError:
            time.sleep(0.25)
    server.kill()
    raise SystemExit("transformers serve did not answer within 180 s")


def openai_messages(messages: list[dict]) -> list[dict]:
    """tuneline's messages as an OpenAI client sends them: calls as `tool_calls` with JSON-text arguments, results as
    `tool` messages answering the call's id."""
    out = []
    for i, message in enumerate(messages):
        if message["role"] == "function":
            call = json.loads(message["content"])
            out.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{i}", "type": "function",
                        "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]})
        elif message["role"] == "observation":
            out.append({"role": "tool", "tool_call_id": f"call_{i - 1}", "content": message["content"]})
        else:
            out.append(message)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--template", default="llama3")
    parser.add_argument("--max-tokens", type=int, default=12)
    args = parser.parse_args(argv)
    from openai import OpenAI

    from cli.main import run
    from tuneline.config import load_config
    from tuneline.serving.chat import Chat

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        path = trained_config(root, args.template, args.max_tokens)
        assert run(["export", str(path)]) == 0
        chat = Chat(load_config(path), root / "chat")
        server, started = serve(root / "export", port := free_port())
        try:
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
            agree, rows = 0, []
            for label, messages, tools in CONVERSATIONS:
                t0 = time.perf_counter()
                ours = chat.respond(messages, tools=tools).text
                t1 = time.perf_counter()
                request = openai_messages(messages)
                reply = client.chat.completions.create(model=str(root / "export"), messages=request, temperature=0,
                                                       max_tokens=args.max_tokens, **({"tools": tools} if tools else {}))
                t2 = time.perf_counter()
                served = (reply.choices[0].message.content or "").strip()
                agree += served == ours
                rows.append((label, ours, served, t1 - t0, t2 - t1))
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(f"template {args.template}; transformers serve started in {started:.1f} s")
    print("| conversation | tuneline chat | transformers serve | same | chat s | serve s |\n|---|---|---|---|---|---|")
    for question, ours, served, chat_s, serve_s in rows:
        print(f"| {question} | {ours!r} | {served!r} | {ours == served} | {chat_s:.2f} | {serve_s:.2f} |")
    print(f"{agree} of {len(rows)} answers identical")
    return 0 if agree == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
