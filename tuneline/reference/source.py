"""Which model is the reference, how a trainer loads it, and the key of the numbers it computes.

`ref_model` when set; for LoRA without it, the policy with its adapter switched off; otherwise the starting model."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from tuneline.config.args import ADAPTER_TYPES
from tuneline.content.code import code_version
from tuneline.content.fingerprint import FileHasher, fingerprint
from tuneline.data.mm.run_media import MEDIA_SETTINGS
from tuneline.runtime.devices import gpu_count

# Files at the top of a model or adapter folder that decide its outputs (checkpoint-*/ folders are ignored).
_MODEL_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".json", ".model", ".gguf")
# Model keys that change what the loaded reference computes for the same tokens.
_MODEL_SETTINGS = ("resize_vocab", "add_special_tokens", "add_tokens", "new_special_tokens_config",
                   "init_special_tokens", "attn_implementation", "flash_attn", "infer_dtype", "quantization_type",
                   "double_quantization")
# The code that computes the stored numbers (and every module it imports): editing it makes them stale.
COMPUTE_ENTRIES = ("tuneline.reference.compute", "tuneline.reference.source")


def reference_source(config) -> dict[str, Any]:
    """What the reference is, as plain data: its kind, model, adapters and quantization."""
    ft, model = config.finetuning, config.model
    if ft.ref_model:
        return {"kind": "ref_model", "model": ft.ref_model, "adapters": _split(ft.ref_model_adapters),
                "quantization_bit": ft.ref_model_quantization_bit}
    kind = "policy-without-adapter" if ft.finetuning_type in ADAPTER_TYPES else "starting-model"
    source = {"kind": kind, "model": model.model_name_or_path, "adapters": _split(model.adapter_name_or_path),
              "quantization_bit": model.quantization_bit}
    if kind == "policy-without-adapter":
        # Whether the last loaded adapter is resumed (and so switched off) or merged changes the reference, and
        # PiSSA moves the adapter's principal part out of the base weights.
        source.update(create_new_adapter=ft.create_new_adapter, pissa_init=ft.pissa_init,
                      pissa_iter=ft.pissa_iter if ft.pissa_init else None)
    return source


def rows_key(config, hasher: FileHasher) -> str:
    """Key of one reference's numbers per row: its weights and adapters, what changes their outputs (model settings,
    precision, the device kind that decides the default dtype), the stage's columns and the computing code."""
    source = reference_source(config)
    content = {
        "model": _model_content(hasher, source["model"], config.model.model_revision),
        "adapters": [_model_content(hasher, a, None) for a in source["adapters"]],
    }
    on_gpu = bool(gpu_count()) and not config.training.get("use_cpu")
    precision = {k: bool(config.training.get(k)) for k in ("bf16", "fp16")} | {"device": "cuda" if on_gpu else "cpu"}
    settings = {k: getattr(config.model, k) for k in (*_MODEL_SETTINGS, *MEDIA_SETTINGS)}  # pixel limits: images
    code = code_version(*COMPUTE_ENTRIES)
    return fingerprint("reference-rows", source, content, settings, precision, config.stage, code)


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
    if ft.finetuning_type in ADAPTER_TYPES:
        return None
    return load_model(config, tokenizer, is_trainable=False)


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
