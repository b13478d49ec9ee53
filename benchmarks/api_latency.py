"""Time to first token and tokens/s of `tuneline api`, against `tuneline chat` and `transformers serve`, on the same
export, one client and four at once.

    python benchmarks/api_latency.py [--preset demo] [--tokens 128] [--rounds 3]

The export is the tiny model (`--preset`) with a random LoRA adapter merged by `tuneline export`. `tuneline chat`
is timed in this process (`Chat.respond`, the answer printed whole, so its first token is its last); the two
servers are started as users start them and called with the `openai` client, streaming. Every answer is greedy and
`max_tokens` long: the end-of-turn tokens are biased away (`logit_bias`) where the server takes it, and the
servers' answers are checked to be the same text. Tokens are counted by tokenizing the answer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "unit")]  # tuneline; the tests' server helpers
QUESTION = "add two and three"


def build_export(root: Path, preset: str) -> tuple[Path, Path]:
    """(export folder, config): the tiny model, a random LoRA adapter, merged by tuneline export."""
    import torch
    import yaml
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tuneline.config import load_config
    from tuneline.demo.tiny_model import TINY_PRESETS, build_tiny_model
    from tuneline.export.merge import export_model

    base = build_tiny_model(root / "base", **TINY_PRESETS[preset])
    torch.manual_seed(3)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), lora).save_pretrained(str(root / "adapter"))
    values = {"model_name_or_path": str(base), "adapter_name_or_path": str(root / "adapter"), "template": "chatml",
              "stage": "sft", "do_train": False, "export_dir": str(root / "export"), "do_sample": False}
    export = export_model(load_config(None, values, check_paths=False))
    config = root / "export.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": str(export), "template": "chatml", "do_train": False,
                                      "finetuning_type": "full", "do_sample": False}))
    return export, config


def time_chat(config: Path, export: Path, tokens: int, rounds: int, tokenizer) -> dict:
    """`tuneline chat`'s answer, in this process: the answer is shown whole when generation ends."""
    from tuneline.config import load_config
    from tuneline.serving.chat import Chat

    chat = Chat(load_config(str(config), [f"max_new_tokens={tokens}"], check_paths=False), model_folder=export)
    chat.settings.sequence_bias = {(token,): -100.0 for token in chat.eos_ids}
    chat.respond([{"role": "user", "content": QUESTION}])  # warm-up
    walls, counts = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        text = chat.respond([{"role": "user", "content": QUESTION}]).text
        walls.append(time.perf_counter() - start)
        counts.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))
    wall = statistics.median(walls)
    return {"ttft_s": wall, "tokens_per_s": statistics.median(counts) / wall, "text": text}


@contextlib.contextmanager
def server(command: list[str], port: int, env: dict, log: Path):
    """A server started as users start it, once it answers /health (the tests' own wait)."""
    from api_server import wait_until_up

    with open(log, "w") as out:
        process = subprocess.Popen(command, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        wait_until_up(port, process, log, timeout=300)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def one_stream(base_url: str, model: str, tokens: int, bias: dict, tokenizer) -> dict:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
    start, first, text = time.perf_counter(), None, ""
    extra = {"logit_bias": bias} if bias else {}
    for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                                max_tokens=tokens, temperature=0, stream=True, **extra):
        delta = chunk.choices[0].delta.content if chunk.choices else None
        if delta:
            first = first or time.perf_counter()
            text += delta
    end = time.perf_counter()
    count = len(tokenizer(text.strip(), add_special_tokens=False)["input_ids"])
    return {"ttft_s": (first or end) - start, "tokens_per_s": count / max(end - (first or start), 1e-9),
            "wall_s": end - start, "tokens": count, "text": text.strip()}


def time_server(base_url: str, model: str, tokens: int, rounds: int, bias: dict, tokenizer) -> dict:
    one_stream(base_url, model, tokens, bias, tokenizer)  # warm-up (transformers serve loads on first request)
    single = [one_stream(base_url, model, tokens, bias, tokenizer) for _ in range(rounds)]
    start = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        four = list(pool.map(lambda _: one_stream(base_url, model, tokens, bias, tokenizer), range(4)))
    wall = time.perf_counter() - start
    return {"ttft_s": statistics.median(r["ttft_s"] for r in single),
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in single), "text": single[0]["text"],
            "four_ttft_s": statistics.mean(r["ttft_s"] for r in four),
            "four_total_tokens_per_s": sum(r["tokens"] for r in four) / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from ports import free_port
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        export, config = build_export(root, args.preset)
        tokenizer = AutoTokenizer.from_pretrained(export)
        eos = {str(t): -100 for t in {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}}
        results = {"tuneline chat": time_chat(config, export, args.tokens, args.rounds, tokenizer)}
        env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
        port = free_port()
        with server([sys.executable, "-m", "cli.main", "api", str(export), "template=chatml"], port, {**env, "API_PORT": str(port)},
                    root / "api.log") as url:
            results["tuneline api"] = time_server(url, "export", args.tokens, args.rounds, eos, tokenizer)
        port = free_port()
        with server([str(Path(sys.executable).with_name("transformers")), "serve", "--device", "cpu", "--port", str(port), str(export)], port, env,
                    root / "serve.log") as url:
            results["transformers serve"] = time_server(url, str(export), args.tokens, args.rounds, {}, tokenizer)
    print(f"export: tiny '{args.preset}' preset + merged LoRA, {args.tokens} greedy tokens, median of "
          f"{args.rounds}, OMP_NUM_THREADS={env['OMP_NUM_THREADS']}")
    print("| server | first token (s) | tokens/s | 4 clients: mean first token (s) | 4 clients: tokens/s, all |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        four = (f"{r['four_ttft_s']:.3f} | {r['four_total_tokens_per_s']:.0f}" if "four_ttft_s" in r else "- | -")
        print(f"| {name} | {r['ttft_s']:.3f} | {r['tokens_per_s']:.0f} | {four} |")
    texts = {name: r["text"] for name, r in results.items()}
    print("same text:", json.dumps({name: text == texts["tuneline chat"] for name, text in texts.items()}))


if __name__ == "__main__":
    main()
