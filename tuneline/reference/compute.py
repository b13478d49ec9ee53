"""Computing reference log-probs with the numbers the trainer's live reference computes (same model, dtype, autocast).

Sequences rather than rows are sorted by length and batched, so a batch of short sequences does not pay for a long
one. On CPU every core this process may use runs (the flow's process may have started with fewer torch threads)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

# The float column each stage's reference adds -> the prefix of the token columns of the sequence it sums.
SEQUENCES = {"dpo": {"ref_chosen_logps": "chosen_", "ref_rejected_logps": "rejected_"},
             "kto": {"ref_logps": "", "ref_kl_logps": "kl_"}}
REF_COLUMNS = {stage: tuple(columns) for stage, columns in SEQUENCES.items()}
TOKEN_COLUMNS = {stage: tuple(f"{prefix}{name}" for prefix in columns.values()
                              for name in ("input_ids", "attention_mask", "labels"))
                 for stage, columns in SEQUENCES.items()}


def reference_device(config):
    """CUDA when the training will run on it (a CUDA device visible, no `use_cpu`), else the CPU."""
    import torch

    from tuneline.model.precision import trains_on_cpu

    return torch.device("cpu" if trains_on_cpu(config) else "cuda")


def usable_cores() -> int:
    """OMP_NUM_THREADS when the user set it, else every core this process may run on."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to `count` for the block, then back to what they were."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def batches_by_length(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Positions in `lengths` grouped into batches of at most `batch_size` similar lengths, longest first (a memory
    limit shows at once)."""
    ordered = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [ordered[start:start + batch_size] for start in range(0, len(ordered), batch_size)]


def compute_rows(config, datasets, rows: dict[str, list[int]]) -> tuple[dict[str, list[tuple[float, ...]]], dict]:
    """Reference values of the given rows of each split ({split: [(value per REF_COLUMNS), ...]} in `rows` order)
    and where they were computed ({"device", "threads"})."""
    import torch

    from tuneline.model import load_tokenizer

    device = reference_device(config)
    tokenizer = load_tokenizer(config.model)
    media = media_collator(config, tokenizer, [datasets[split] for split in rows])
    with torch_threads(usable_cores()) if device.type == "cpu" else nullcontext():
        model, context = load_for_precompute(config, tokenizer, device)
        batch_size = int(config.training.get("per_device_eval_batch_size") or 8)
        values = {split: split_rows(model, context, datasets[split], indices, config, tokenizer, batch_size, media)
                  for split, indices in rows.items() if indices}
        used = {"device": str(device), "threads": torch.get_num_threads()}
    del model, context
    if device.type == "cuda":  # the training starts next, in another process: hand back what this one cached
        torch.cuda.empty_cache()
    return values, used


def load_for_precompute(config, tokenizer, device):
    """(model on `device`, context) computing what the live reference the trainer would use computes."""
    from tuneline.model import load_model
    from tuneline.reference.source import load_reference_model

    model, context = load_reference_model(config, tokenizer), nullcontext
    if model is None:  # LoRA without ref_model: the policy as training starts, its adapter switched off
        model = load_model(config, tokenizer, is_trainable=True)
        context = model.disable_adapter
    if getattr(model, "hf_device_map", None) is None:  # quantized weights were placed on their GPU when loaded
        model = model.to(device)
    return model.eval(), context


def media_collator(config, tokenizer, splits):
    """The collator that makes the pixels of rows with images (as the trainer's makes them), or None for text."""
    from tuneline.data import build_collator
    from tuneline.data.mm.run_media import dataset_media

    media = dataset_media(config, tokenizer, splits)
    return None if media is None else build_collator(config.stage, tokenizer, media=media)


def split_rows(model, context, dataset, rows: list[int], config, tokenizer, batch_size: int, media=None):
    """Reference values of `rows` of one split, in `rows` order: each row's sequences summed, in length batches;
    `media`: a collator whose `media_inputs` give each sequence its row's images (decoded here)."""
    import torch

    from tuneline.model.precision import PRECISION_DTYPES, training_precision
    from tuneline.objectives.logps import IGNORE_INDEX, pad_right, sequence_logps

    columns = SEQUENCES[config.stage]
    device = next(model.parameters()).device
    precision = training_precision(config)
    autocast = torch.autocast(device.type, dtype=getattr(torch, PRECISION_DTYPES[precision]),
                              enabled=precision != "fp32")  # as accelerate runs the trainer's live reference
    view = dataset.select_columns(list(TOKEN_COLUMNS[config.stage]) + (["images", "videos"] if media else []))
    items = [(row, name) for name in columns for row in rows]
    lengths = [n for prefix in columns.values() for n in sequence_lengths(dataset, rows, f"{prefix}input_ids")]
    pad = tokenizer.pad_token_id or 0
    found: dict[tuple[int, str], float] = {}
    with torch.inference_mode(), context(), autocast:
        for batch in batches_by_length(lengths, 2 * batch_size):
            tensors = {key: [] for key in ("input_ids", "attention_mask", "labels")}
            sequences = []
            for row, name in (items[i] for i in batch):
                features = view[row]
                for key, values in tensors.items():
                    values.append(torch.tensor([features[f"{columns[name]}{key}"]], device=device))
                sequences.append({**features, "input_ids": features[f"{columns[name]}input_ids"]})
            input_ids = pad_right(tensors["input_ids"], pad)
            extra = media.media_inputs(sequences, input_ids.shape[1]) if media else {}
            sums, _ = sequence_logps(model, input_ids, pad_right(tensors["attention_mask"], 0),
                                     pad_right(tensors["labels"], IGNORE_INDEX),
                                     **{k: v.to(device) if hasattr(v, "to") else v for k, v in extra.items()})
            found.update(zip((items[i] for i in batch), sums.float().cpu().tolist(), strict=True))
    return [tuple(found[row, name] for name in columns) for row in rows]


def sequence_lengths(dataset, rows: list[int], column: str) -> list[int]:
    """Token counts of one list column at `rows`, read from Arrow."""
    import pyarrow.compute as pc

    table = dataset.select(rows).select_columns([column]).with_format("arrow")[:]
    return pc.list_value_length(table.column(column)).to_pylist()
