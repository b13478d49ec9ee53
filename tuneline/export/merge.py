"""`tuneline export CONFIG`: merge LoRA adapters into the base and save a standalone model with its tokenizer (and
a vision-language model's processor).

With no trained model and no `adapter_name_or_path` there is nothing to export: a refusal, never the untouched base
under a new name. Merging happens in fp32 on the CPU, whatever the training precision, so the merged weights are
W + BA to float accuracy. An existing `export_dir` is only replaced when an earlier export wrote it."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from tuneline.config import RunConfig
from tuneline.config.run_config import split_names
from tuneline.errors import ConfigError
from tuneline.export.trained_model import trained_model_config

logger = logging.getLogger("tuneline")

EXPORT_RECORD = "tuneline_export.json"


def _check_export(config: RunConfig) -> Path:
    margs = config.model
    problems = []
    if not margs.export_dir:
        problems.append("'export_dir' is not set: name the folder the merged model is written to")
    if margs.quantization_bit is not None:
        problems.append(f"'quantization_bit: {margs.quantization_bit}' cannot be exported: adapters do not merge "
                        "into quantized weights; remove 'quantization_bit' to merge into the full-precision base")
    target = Path(margs.export_dir or ".").expanduser()
    if margs.export_dir and target.exists() and any(target.iterdir()) and not (target / EXPORT_RECORD).is_file():
        problems.append(f"'export_dir' '{target}' holds files that no earlier export wrote; choose a new or empty "
                        "folder")
    if problems:
        raise ConfigError(problems)
    return target


def _saved_dtype(config: RunConfig):
    """The dtype the exported weights are stored in."""
    import torch
    from transformers import AutoConfig

    if config.model.infer_dtype != "auto":
        return getattr(torch, config.model.infer_dtype)
    base = AutoConfig.from_pretrained(config.model.model_name_or_path, trust_remote_code=config.model.trust_remote_code,
                                      revision=config.model.model_revision, cache_dir=config.model.cache_dir)
    dtype = getattr(base, "dtype", None) or getattr(base, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def _to_legacy_bin(folder: Path) -> None:
    """Rewrite the safetensors shards as pytorch_model*.bin with a matching index (export_legacy_format)."""
    import torch
    from safetensors.torch import load_file

    renames = {}
    for shard in sorted(folder.glob("model*.safetensors")):
        legacy = shard.name.replace("model", "pytorch_model", 1).replace(".safetensors", ".bin")
        torch.save(load_file(shard), folder / legacy)
        shard.unlink()
        renames[shard.name] = legacy
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        data["weight_map"] = {k: renames[v] for k, v in data["weight_map"].items()}
        (folder / "pytorch_model.bin.index.json").write_text(json.dumps(data, indent=2))
        index.unlink()


def is_reward_model(config: RunConfig) -> bool:
    """A reward model exports as the sequence scorer it is, score head kept: 'stage: rm', or adapters an rm run
    trained (peft's SEQ_CLS task) under another stage's config."""
    tasks = {json.loads(path.read_text()).get("task_type") for name in split_names(config.model.adapter_name_or_path)
             if (path := Path(name) / "adapter_config.json").is_file()}
    return config.stage == "rm" or "SEQ_CLS" in tasks


def _merged_model(config: RunConfig, tokenizer):
    from tuneline.model.loader import load_model

    fp32 = dataclasses.replace(config, model=dataclasses.replace(config.model, infer_dtype="float32"))
    model = load_model(fp32, tokenizer, is_trainable=False, add_valuehead=is_reward_model(config))
    if hasattr(model, "peft_config"):  # load_model merges every adapter when not training; this is a safeguard
        model = model.merge_and_unload()
    return model


def export_model(config: RunConfig) -> Path:
    """Write the merged model (safetensors shards of `export_size` GB, or .bin) and tokenizer to `export_dir`, the
    tokenizer speaking the training template (`export_chat`)."""
    from tuneline.export.chat_template import prepare_chat, stop_at_turn_ends, write_chat_files
    from tuneline.model.processor import load_processor, save_processor
    from tuneline.model.tokenizer import load_tokenizer

    target = _check_export(config)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with tempfile.TemporaryDirectory() as scratch:
        config, trained_in = trained_model_config(config, Path(scratch))
        tokenizer = load_tokenizer(config.model)
        model = _merged_model(config, tokenizer).to(_saved_dtype(config))
        processor = load_processor(config, tokenizer)
        chat, template = prepare_chat(config, tokenizer, processor)
        stop_at_turn_ends(model, template, tokenizer)
        model.save_pretrained(str(tmp), max_shard_size=f"{config.model.export_size}GB")
        tokenizer.save_pretrained(str(tmp))
        save_processor(processor, tmp)  # a vision-language model reads images; None writes nothing
        write_chat_files(tmp, chat, template, tokenizer, config)
    if config.model.export_legacy_format:
        _to_legacy_bin(tmp)
    record = {"model_name_or_path": config.model.model_name_or_path, "trained_in": trained_in,
              "adapters": split_names(config.model.adapter_name_or_path), "dtype": str(model.dtype),
              "legacy_format": config.model.export_legacy_format, **chat.record()}
    (tmp / EXPORT_RECORD).write_text(json.dumps(record, indent=2))
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    logger.info("exported the merged model to %s", target)
    return target


def export_warnings(folder: Path) -> list[str]:
    """What the export's chat template cannot write, and what that means for serving, from its record."""
    record = json.loads((Path(folder) / EXPORT_RECORD).read_text())
    return [f"the chat template cannot write {gap['part']}: {gap['consequence']} (see SERVING.md)"
            for gap in record.get("unwritable", [])]
