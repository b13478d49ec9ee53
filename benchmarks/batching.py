"""Padded against padding-free sft batches, per attention: `python benchmarks/batching.py [--device cuda]
[--preset half-b] [--vocab 32000] [--batch 8] [--cutoff 1024] [--steps 20] [--json FILE]`.

Times whole training steps (forward, backward, AdamW) of a random Llama (`tuneline.demo.tiny_model` preset sizes, a
real vocabulary) on the same batches of alpaca-like sft rows (lengths log-normal around --mean-tokens, cut at
--cutoff, prompt tokens unlabelled), collated by tuneline's collator padded or flattened, with each attention that
can run here: sdpa, tuneline's per-example `sdpa_packed`, flex_attention (CUDA) and flash_attention_2 (when
flash-attn imports). Prints, per case: non-padding tokens/s, the step time, peak memory (CUDA), and the largest
difference of its per-step losses from the padded sdpa case; marks the case `tuneline.model.batching` picks for
this device. `make gpu-check` runs it first. Figures only: nothing is asserted. Needs only torch and transformers
beside tuneline's own modules (no Prefect, MLflow or datasets), so it runs on a bare GPU image.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tuneline from this checkout, installed or not


def sft_rows(count: int, mean_tokens: int, cutoff: int, vocab: int, seed: int) -> list[dict]:
    """Token rows with their labels: the first 30-70% of each row is prompt (-100), the rest answer."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        length = max(16, min(cutoff, int(rng.lognormvariate(math.log(mean_tokens), 0.7))))
        ids = [rng.randrange(3, vocab) for _ in range(length)]
        prompt = int(length * rng.uniform(0.3, 0.7))
        rows.append({"input_ids": ids, "attention_mask": [1] * length, "labels": [-100] * prompt + ids[prompt:]})
    return rows


def cases(device: str) -> list[tuple[str, bool, str]]:
    """(name, flatten, attention) of each case this machine can run, padded sdpa first (the losses' reference)."""
    import torch

    from tuneline.model.packed_attention import register_packed_sdpa
    from tuneline.runtime.requirements import installed

    found = [("padded sdpa", False, "sdpa"), ("flattened sdpa", True, "sdpa"),
             ("flattened sdpa_packed", True, register_packed_sdpa())]
    if device == "cuda":
        found.append(("flattened flex_attention", True, "flex_attention"))
        if installed("flash_attn"):
            found += [("padded flash_attention_2", False, "flash_attention_2"),
                      ("flattened flash_attention_2", True, "flash_attention_2")]
    if device == "cuda" and not torch.cuda.is_bf16_supported():
        found = [case for case in found if case[2] != "flex_attention"]
    return found


def chosen_case(device: str) -> tuple[bool, str]:
    """What `tuneline.model.batching` picks for plain sft rows with sdpa on this device."""
    from tuneline.config import load_config
    from tuneline.model.batching import batching

    config = load_config(None, {"model_name_or_path": "unused", "dataset": "unused", "stage": "sft"}, check_paths=False)
    choice = batching(config, device)
    return choice.flatten, choice.attention


def run_case(state: dict, model_config, batches: list[dict], attention: str, device: str, dtype, warmup: int) -> dict:
    import torch
    from transformers import LlamaForCausalLM

    model_config._attn_implementation = attention
    model = LlamaForCausalLM(model_config).to(device=device, dtype=dtype)
    model.load_state_dict(state)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    losses, times = [], []
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for step, batch in enumerate(batches):
        batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - start)
        losses.append(loss.item())
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
    del model, optimizer
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"losses": losses, "seconds": sum(times), "step_ms": 1000 * statistics.median(times), "peak_mb": peak}


def main() -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tuneline.data.collators import build_collator
    from tuneline.demo.tiny_model import TINY_PRESETS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--preset", default="half-b", choices=sorted(TINY_PRESETS))
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--cutoff", type=int, default=1024)
    parser.add_argument("--mean-tokens", type=int, default=250)
    parser.add_argument("--steps", type=int, default=20, help="timed steps, after --warmup untimed ones")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()

    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    sizes = {**TINY_PRESETS[args.preset], "max_position_embeddings": max(args.cutoff, 2048)}
    model_config = LlamaConfig(vocab_size=args.vocab, tie_word_embeddings=False, pad_token_id=0, **sizes)
    torch.manual_seed(args.seed)
    state = LlamaForCausalLM(model_config).to(dtype).state_dict()
    rows = sft_rows(args.batch * (args.steps + args.warmup), args.mean_tokens, args.cutoff, args.vocab, args.seed)
    groups = [rows[i:i + args.batch] for i in range(0, len(rows), args.batch)]
    collators = {flatten: build_collator("sft", type("Pad", (), {"pad_token_id": 0})(), flatten=flatten)
                 for flatten in (False, True)}
    tokens = sum(len(row["input_ids"]) for group in groups[args.warmup:] for row in group)
    padded = sum(args.batch * max(len(row["input_ids"]) for row in group) for group in groups[args.warmup:])
    chosen = chosen_case(args.device)

    results = []
    for name, flatten, attention in cases(args.device):
        batches = [collators[flatten](group) for group in groups]
        try:
            result = run_case(state, model_config, batches, attention, args.device, dtype, args.warmup)
        except Exception as exc:  # a kernel this machine lacks: say so and go on
            print(f"{name}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
            continue
        result.update(name=name, flatten=flatten, attention=attention, tokens_per_s=tokens / result["seconds"],
                      chosen=(flatten, attention) == chosen)
        reference = results[0]["losses"] if results else result["losses"]
        result["max_loss_diff"] = max(abs(a - b) for a, b in zip(result["losses"], reference, strict=True))
        results.append(result)
        print(f"{name}: {result['tokens_per_s']:,.0f} tokens/s", flush=True)

    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"\n{gpu}; {args.preset} sizes, vocab {args.vocab}, {args.device} {str(dtype).split('.')[-1]}; batch "
          f"{args.batch}, cutoff {args.cutoff}, mean row {tokens / (args.steps * args.batch):.0f} tokens; "
          f"padding {1 - tokens / padded:.0%} of the padded batches; {args.steps} timed steps\n")
    print("| case | tokens/s | step ms | peak MiB | max loss diff vs padded sdpa | picked |")
    print("|---|---|---|---|---|---|")
    for r in results:
        peak = f"{r['peak_mb']:,.0f}" if r["peak_mb"] is not None else "-"
        print(f"| {r['name']} | {r['tokens_per_s']:,.0f} | {r['step_ms']:.1f} | {peak} | {r['max_loss_diff']:.2e} "
              f"| {'yes' if r['chosen'] else ''} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": gpu, "args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
