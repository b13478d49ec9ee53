"""The optimizers LLaMA-Factory's keys choose, side by side: `python benchmarks/optimizer_choices.py [--hidden 256]
[--layers 4] [--steps 20] [--device cpu|cuda] [--json FILE]`.

Builds each optimizer with tuneline's own factory (the one `tuneline.train` uses) on the same random Llama and the
same random batches, and times whole training steps (forward, backward, optimizer step; layerwise ones step inside
the backward pass). Prints, per optimizer: ms per step, the bytes its state_dict holds after training (what each
checkpoint saves, and a proxy for its memory beside the weights), and the loss of the last step. Figures only:
nothing is asserted. Needs galore-torch, apollo-torch and adam-mini (`pip install -e '.[galore,apollo,adam-mini]'`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tuneline from this checkout, installed or not

CASES = {  # name -> finetuning keys
    "adamw (Trainer's)": {},
    "galore": {"use_galore": True},
    "galore layerwise": {"use_galore": True, "galore_layerwise": True},
    "apollo": {"use_apollo": True},
    "apollo layerwise": {"use_apollo": True, "apollo_layerwise": True},
    "adam-mini": {"use_adam_mini": True},
    "muon": {"use_muon": True},
}
RANK = 16  # galore_rank / apollo_rank, LLaMA-Factory's default


def finetuning_args(**keys) -> SimpleNamespace:
    from tuneline.config.args import FinetuningArgs

    return SimpleNamespace(**{**FinetuningArgs().__dict__, "galore_rank": RANK, "apollo_rank": RANK, **keys})


def build_model(hidden: int, layers: int, device: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=max(hidden // 64, 1), num_key_value_heads=max(hidden // 128, 1),
                         vocab_size=4096)
    return LlamaForCausalLM(config).to(device)


def state_bytes(state) -> int:
    import torch

    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    if hasattr(state, "__dict__"):  # a projector object: its matrices
        return state_bytes(vars(state))
    return 0


def run_case(keys: dict, args) -> dict:
    import torch
    from transformers import Trainer, TrainingArguments

    from tuneline.train.trainer_base import build_custom_optimizer

    model = build_model(args.hidden, args.layers, args.device)
    training_args = TrainingArguments(output_dir="/tmp/optimizer_choices", learning_rate=1e-3, report_to=[],
                                      use_cpu=args.device == "cpu")
    optimizer = build_custom_optimizer(model, training_args, finetuning_args(**keys))
    if optimizer is None:
        cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(training_args, model)
        optimizer = cls(model.parameters(), **kwargs)
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(3, 4096, (4, args.seq), generator=generator).to(args.device) for _ in range(args.steps)]
    times, loss = [], None
    for step, ids in enumerate(batches):
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if args.device == "cuda":
            torch.cuda.synchronize()
        if step >= 2:  # the first steps build projections and state
            times.append(time.perf_counter() - start)
    return {"ms_per_step": 1000 * sum(times) / len(times), "state_mb": state_bytes(optimizer.state_dict()) / 2**20,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6, "last_loss": loss.item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json")
    args = parser.parse_args()
    results = {}
    print("| optimizer | ms/step | optimizer state (MB) | last loss |\n|---|---|---|---|")
    for name, keys in CASES.items():
        results[name] = run_case(keys, args)
        r = results[name]
        print(f"| {name} | {r['ms_per_step']:.1f} | {r['state_mb']:.2f} | {r['last_loss']:.3f} |", flush=True)
    print(f"model: {next(iter(results.values()))['params_m']:.1f}M parameters, hidden {args.hidden}, {args.layers} "
          f"layers, batch 4 x {args.seq} tokens, {args.steps} steps, rank {RANK}, device {args.device}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
