"""What `tuneline api TARGET` serves: a training config's trained model, a registered MLflow version
(`models:/NAME@ALIAS`, read at start, so a retrain that moves the alias is served by the next start) or an exported
folder. Each becomes the same `tuneline.serving.chat.Chat`, so answers are `tuneline chat`'s and the MLflow model's."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from tuneline.config.serving_keys import ServingArgs, backend_problems, split_serving_keys
from tuneline.errors import ConfigError, UserError

MODELS_URI = "models:/"
MODEL_NAME_ENV = "API_MODEL_NAME"  # LLaMA-Factory's name for the served model's id
TITLE = "cannot serve"


@dataclass
class ServedTarget:
    """What was asked for, read and checked before any model loads."""

    kind: str  # "config", "registered" or "export"
    target: str
    serving: ServingArgs
    settings: dict  # the config's keys (config, export) or the overrides of the registered model's config
    model_id: str


def read_target(target: str, overrides: list[str]) -> ServedTarget:
    """The target and its keys, the serving keys taken out and checked; every problem at once, nothing loaded."""
    from tuneline.config.loader import parse_overrides, read_yaml

    given = parse_overrides(overrides)
    if target.startswith(MODELS_URI):
        kind, raw = "registered", dict(given)
        name = target[len(MODELS_URI):].split("@")[0].split("/")[0]
    elif Path(target).is_dir():
        kind, raw, name = "export", {**_export_keys(Path(target)), **given}, Path(target).resolve().name
    elif Path(target).is_file():
        kind, raw = "config", {**read_yaml(target), **given}
        name = Path(target).stem
    else:
        raise UserError(f"'{target}' is neither a config file, an exported model folder, nor a registered model "
                        "(models:/NAME@ALIAS or models:/NAME/VERSION)", title=TITLE)
    serving, rest, problems = split_serving_keys(raw)
    problems += backend_problems(serving)
    if serving.infer_backend == "vllm" and kind != "export" and not problems:
        problems.append("'infer_backend: vllm' serves an exported model: `tuneline export` the config first (the "
                        "export carries the template it was trained with), then `tuneline api EXPORT_DIR "
                        "infer_backend=vllm`")
    if problems:
        raise ConfigError(problems, source=target)
    return ServedTarget(kind, target, serving, rest, os.environ.get(MODEL_NAME_ENV) or name)


def _export_keys(folder: Path) -> dict:
    """An exported folder as a config: the folder is the model; its template is the one its export recorded, else
    the tokenizer's own chat template (which an export writes to render as the model trained)."""
    from tuneline.export.merge import EXPORT_RECORD

    if not (folder / "config.json").is_file():
        raise UserError(f"'{folder}' holds no model (no config.json): name a `tuneline export` folder, a config or "
                        "models:/NAME@ALIAS", title=TITLE)
    record = folder / EXPORT_RECORD
    recorded = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else {}
    keys = {"model_name_or_path": str(folder), "template": recorded.get("template") or "auto",
            "finetuning_type": "full", "do_train": False}
    if recorded.get("tool_format"):
        keys["tool_format"] = recorded["tool_format"]
    return keys


def load_chat(served: ServedTarget, scratch: Path):
    """The `Chat` that answers, loaded (the slow part: the model)."""
    from tuneline.config import load_config
    from tuneline.serving.chat import Chat

    if served.kind == "registered":
        from tuneline.tracking.served_model import load_served_model

        return load_served_model(served.target, served.settings)
    config = load_config(None, served.settings, check_paths=False)
    if served.kind == "export":
        return Chat(config, scratch, model_folder=Path(served.target))
    return Chat(config, scratch)
