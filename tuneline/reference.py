"""`build-reference-model`: run the reference model once and store its log-probs beside the processed data.

DPO-style and KTO training compare the policy to a frozen reference. Keeping that model in memory and running
it on every batch of every run doubles the cost; instead its per-sequence log-probs are computed once, saved
as extra columns of a copy of the processed dataset, and keyed by what decides them: the reference model's
content (weights and adapters), the dataset fingerprint, `cutoff_len`, template and stage. Nothing that only
shapes training (`pref_beta`, `pref_loss` among sigmoid/hinge/ipo, `learning_rate`, epochs) is in the key, so
a sweep over those reuses one entry. Log-probs are stored as sums; ipo's per-token mean is taken at training
time from the labels, which is why pref_loss need not be in the key.

Which reference: `ref_model` (+ `ref_model_adapters`) when set; for LoRA without it, the policy as training
starts with its adapter switched off (the base model and any `adapter_name_or_path` adapters); for full or
freeze tuning, the starting model itself.

This module imports no torch until a build actually runs, so fingerprinting stays fast.
"""

from __future__ import annotations

import copy
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from tuneline.fingerprint import FileHasher, fingerprint, memo_dir
from tuneline.losses import REFERENCE_FREE
from tuneline.step_cache import cached_step

STEP = "build-reference-model"
_CODE_FILES = ("reference.py", "logps.py")
# Files at the top of a model or adapter folder that decide its outputs (checkpoint-*/ folders are ignored).
_MODEL_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".json", ".model", ".gguf")
# Token columns each stage's reference reads, and the float columns it adds.
TOKEN_COLUMNS = {
    "dpo": ("chosen_input_ids", "chosen_attention_mask", "chosen_labels",
            "rejected_input_ids", "rejected_attention_mask", "rejected_labels"),
    "kto": ("input_ids", "attention_mask", "labels", "kl_input_ids", "kl_attention_mask", "kl_labels"),
}
REF_COLUMNS = {"dpo": ("ref_chosen_logps", "ref_rejected_logps"), "kto": ("ref_logps", "ref_kl_logps")}


def uses_reference(config) -> bool:
    """Whether training compares the policy with a reference model at all (live or precomputed)."""
    ft = config.finetuning
    if ft.stage == "dpo":
        return ft.pref_loss not in REFERENCE_FREE
    return ft.stage == "kto"


def needs_reference(config) -> bool:
    """Whether the `build-reference-model` step precomputes anything for this config."""
    return uses_reference(config) and bool(config.finetuning.precompute_ref)


def not_needed_reason(config) -> str:
    ft = config.finetuning
    if ft.stage not in REF_COLUMNS:
        return f"stage '{ft.stage}' trains without precomputed reference log-probs"
    if not uses_reference(config):
        return f"pref_loss '{ft.pref_loss}' uses no reference model"
    return "precompute_ref is false: the trainer runs the reference model live"


def reference_fingerprint(config, dataset_fingerprint: str) -> str:
    """Content key of the stored reference log-probs (see the module docstring for what is in it)."""
    ft = config.finetuning
    if not needs_reference(config):
        return fingerprint("no-reference", config.stage, ft.pref_loss)
    hasher = FileHasher(memo_dir(config))
    source = reference_source(config)
    content = {
        "model": _model_content(hasher, source["model"], config.model.model_revision),
        "adapters": [_model_content(hasher, a, None) for a in source["adapters"]],
    }
    root = Path(__file__).resolve().parent
    code = {name: hasher.hash_file(root / name) for name in _CODE_FILES}
    hasher.save()
    precision = {k: bool(config.training.get(k)) for k in ("bf16", "fp16")}
    return fingerprint(STEP, source, content, code, dataset_fingerprint, config.data.cutoff_len,
                       config.data.template, config.stage, precision)


def reference_source(config) -> dict[str, Any]:
    """What the reference is, as plain data: its kind, model, adapters and quantization."""
    ft, model = config.finetuning, config.model
    if ft.ref_model:
        return {"kind": "ref_model", "model": ft.ref_model, "adapters": _split(ft.ref_model_adapters),
                "quantization_bit": ft.ref_model_quantization_bit}
    kind = "policy-without-adapter" if ft.finetuning_type == "lora" else "starting-model"
    source = {"kind": kind, "model": model.model_name_or_path, "adapters": _split(model.adapter_name_or_path),
              "quantization_bit": model.quantization_bit}
    if kind == "policy-without-adapter":
        # Whether the last loaded adapter is resumed (and so switched off) or merged changes the reference.
        source["create_new_adapter"] = ft.create_new_adapter
    return source


def build_reference_logps(config, dataset_ref: dict) -> dict[str, Any]:
    """Precompute reference log-probs over every split (cached); returns the stored dataset's reference."""
    if not needs_reference(config):
        return {"needed": False, "reason": not_needed_reason(config),
                "fingerprint": reference_fingerprint(config, dataset_ref.get("fingerprint", ""))}
    key = reference_fingerprint(config, dataset_ref["fingerprint"])
    ref = cached_step(config.pipeline.pipeline_cache_dir, STEP, key,
                      lambda folder: _build(config, dataset_ref, folder), refresh=config.pipeline.refresh_cache)
    return {**ref, "needed": True}


def reference_config(config):
    """A copy of the run config whose model is `ref_model` (with its adapters and quantization)."""
    ft = config.finetuning
    ref = copy.deepcopy(config)
    ref.model.model_name_or_path = ft.ref_model
    ref.model.adapter_name_or_path = ft.ref_model_adapters
    ref.model.quantization_bit = ft.ref_model_quantization_bit
    return ref


def load_reference_model(config, tokenizer):
    """The frozen reference a trainer runs live, or None when it is the policy with its adapter disabled."""
    from tuneline.model import load_model

    ft = config.finetuning
    if ft.ref_model:
        return load_model(reference_config(config), tokenizer, is_trainable=False)
    if ft.finetuning_type == "lora":
        return None
    return load_model(config, tokenizer, is_trainable=False)


def _reference_for_precompute(config, tokenizer):
    """(model, context) computing the same numbers as the live reference the trainer would use."""
    reference = load_reference_model(config, tokenizer)
    if reference is not None:
        return reference, nullcontext
    from tuneline.model import load_model

    policy = load_model(config, tokenizer, is_trainable=True)
    return policy, policy.disable_adapter


def _build(config, dataset_ref: dict, folder: Path) -> dict[str, Any]:
    from datasets import DatasetDict

    from tuneline.data import load_processed
    from tuneline.model import load_tokenizer

    start = time.perf_counter()
    tokenizer = load_tokenizer(config.model)
    model, context = _reference_for_precompute(config, tokenizer)
    datasets = load_processed(dataset_ref)
    batch_size = int(config.training.get("per_device_eval_batch_size") or 8)
    out = {}
    for split, dataset in datasets.items():
        values = split_logps(model, context, dataset, config.stage, tokenizer, batch_size)
        for name, column in values.items():
            dataset = dataset.add_column(name, column)
        out[split] = dataset
    DatasetDict(out).save_to_disk(str(folder))
    return {"rows": {split: len(ds) for split, ds in out.items()}, "columns": list(REF_COLUMNS[config.stage]),
            "dataset_fingerprint": dataset_ref["fingerprint"], "source": reference_source(config),
            "seconds": round(time.perf_counter() - start, 3)}


def split_logps(model, context, dataset, stage: str, tokenizer, batch_size: int) -> dict[str, list[float]]:
    """Reference log-prob columns for one split, in row order."""
    import torch
    from torch.utils.data import DataLoader

    from tuneline.data import build_collator

    collator = build_collator(stage, tokenizer, None)
    loader = DataLoader(dataset.select_columns(list(TOKEN_COLUMNS[stage])), batch_size=batch_size,
                        shuffle=False, collate_fn=collator)
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id or 0
    columns: dict[str, list[float]] = {name: [] for name in REF_COLUMNS[stage]}
    model.eval()
    with torch.no_grad(), context():
        for batch in loader:
            batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
            for name, values in PRECOMPUTE[stage](model, batch, pad).items():
                columns[name].extend(values.float().cpu().tolist())
    return columns


def _dpo_logps(model, batch, pad: int) -> dict[str, Any]:
    from tuneline.logps import pair_logps

    chosen, rejected, _, _ = pair_logps(model, batch, pad)
    return {"ref_chosen_logps": chosen, "ref_rejected_logps": rejected}


def _kto_logps(model, batch, pad: int) -> dict[str, Any]:
    from tuneline.logps import completion_logps

    logps, _ = completion_logps(model, batch)
    kl_logps, _ = completion_logps(model, batch, "kl_")
    return {"ref_logps": logps, "ref_kl_logps": kl_logps}


PRECOMPUTE = {"dpo": _dpo_logps, "kto": _kto_logps}


def _model_content(hasher: FileHasher, path: str | None, revision: str | None) -> Any:
    """Hashes of a local model or adapter folder's top-level files; a hub id is named by id and revision."""
    root = Path(str(path)).expanduser()
    if root.is_file():
        return {root.name: hasher.hash_file(root)}
    if not root.is_dir():
        return {"hub": path, "revision": revision}
    files = sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(_MODEL_SUFFIXES))
    return {p.name: hasher.hash_file(p) for p in files}


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]
