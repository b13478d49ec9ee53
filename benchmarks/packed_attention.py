"""One attention layer on a packed batch, on CPU: `python benchmarks/packed_attention.py [--example-tokens 146]`.

Times forward + backward of transformers' sdpa with the block-diagonal causal mask a packed sft batch gets, against
tuneline's `sdpa_packed` (causal sdpa per packed example, `tuneline.model.packed_attention`), on the shapes of
`benchmarks/train_throughput.py` (batch 4, 4 heads of 64, rows of 512 tokens) and rows filled with examples of
about --example-tokens tokens (146: alpaca-like rows; 25: the demo set). Also prints the once-per-forward cost of
checking the mask and finding the examples, and the largest output difference. Figures only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time


def packed_rows(batch: int, tokens: int, example_tokens: int, seed: int = 0) -> list[list[int]]:
    """Example lengths per row (within +-50% of example_tokens), the last one cut to fill the row."""
    rng, rows = random.Random(seed), []
    for _ in range(batch):
        lengths = []
        while sum(lengths) < tokens:
            lengths.append(min(tokens - sum(lengths), rng.randint(example_tokens // 2, example_tokens * 3 // 2)))
        rows.append(lengths)
    return rows


def median_ms(step, repeats: int) -> float:
    for _ in range(3):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from tuneline.model.packed_attention import block_diagonal_segments, packed_sdpa_attention_forward

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--example-tokens", type=int, default=146)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    rows = packed_rows(args.batch, args.tokens, args.example_tokens)
    position_ids = torch.tensor([[i for n in lengths for i in range(n)] for lengths in rows])
    example = torch.tensor([[k for k, n in enumerate(lengths) for _ in range(n)] for lengths in rows])
    causal = torch.ones(args.tokens, args.tokens, dtype=torch.bool).tril()
    mask = ((example[:, :, None] == example[:, None, :]) & causal)[:, None]
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = args.heads // args.kv_heads, True
    torch.manual_seed(0)
    # (batch, heads, tokens, dim) views of (batch, tokens, heads, dim) tensors, as the projections give them
    query = torch.randn(args.batch, args.tokens, args.heads, args.head_dim).transpose(1, 2).requires_grad_()
    key, value = (torch.randn(args.batch, args.tokens, args.kv_heads, args.head_dim).transpose(1, 2).requires_grad_()
                  for _ in range(2))

    def run(attention):
        return attention(module, query, key, value, mask, scaling=args.head_dim ** -0.5, position_ids=position_ids)[0]

    grad = torch.randn_like(run(sdpa_attention_forward))
    kernels = {"sdpa + mask": sdpa_attention_forward, "sdpa_packed": packed_sdpa_attention_forward}
    timings = {name: median_ms(lambda fn=fn: run(fn).backward(grad), args.repeats) for name, fn in kernels.items()}
    check_ms = median_ms(lambda: block_diagonal_segments(mask, position_ids), args.repeats)
    with torch.no_grad():
        diff = (run(sdpa_attention_forward) - run(packed_sdpa_attention_forward)).abs().max().item()
    examples = sum(len(lengths) for lengths in rows)
    print(f"batch {args.batch}, heads {args.heads}/{args.kv_heads} x {args.head_dim}, {args.tokens} tokens a row, "
          f"{examples} examples ({args.batch * args.tokens / examples:.0f} tokens each), "
          f"{torch.get_num_threads()} threads")
    for name, ms in timings.items():
        print(f"{name:<12} fwd+bwd {ms:7.2f} ms a layer")
    print(f"speed-up {timings['sdpa + mask'] / timings['sdpa_packed']:.2f}x; mask check (once a forward) "
          f"{check_ms:.2f} ms; max |difference| {diff:.1e}")


if __name__ == "__main__":
    main()
