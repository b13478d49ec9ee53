"""Read a run config from YAML plus `key=value` overrides, and report every problem at once."""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tuneline.config.args import GROUPS
from tuneline.config.checkpointing import resolve_checkpointing
from tuneline.config.coerce import coerce
from tuneline.config.llamafactory_keys import REFUSED, refused_problems
from tuneline.config.ray_keys import RAY_KEYS, ray_run_problems, ray_settings
from tuneline.config.run_config import RunConfig
from tuneline.config.torchrun_env import torchrun_values
from tuneline.config.training_keys import TRAINING_DEFAULTS, TRAINING_KEYS, UNSUPPORTED_KEYS
from tuneline.config.validate import check_combinations
from tuneline.errors import ConfigError, did_you_mean


def _group_fields() -> dict[str, tuple[str, dataclasses.Field, Any]]:
    table = {}
    for group, cls in GROUPS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            table[f.name] = (group, f, hints[f.name])
    return table


GROUP_FIELDS = _group_fields()
ALL_KEYS = set(GROUP_FIELDS) | set(TRAINING_KEYS) | set(UNSUPPORTED_KEYS)


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`key=value` strings, values typed as YAML types them."""
    out, problems = {}, []
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            problems.append(f"override '{pair}' is not of the form key=value")
            continue
        out[key.strip()] = yaml.safe_load(raw) if raw.strip() else None
    if problems:
        raise ConfigError(problems, source="overrides")
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"'{path}' is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"'{path}' must hold a mapping of key: value, not {type(data).__name__}")
    return data


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | list[str] | None = None,
                check_paths: bool = True, more_checks: Callable[[RunConfig], list[str]] | None = None) -> RunConfig:
    """Parse, type and validate a config; raise ConfigError listing every problem, those `more_checks` finds
    too (checks that need more than the config package knows, such as tuneline.pipeline.preflight's)."""
    raw = read_yaml(path) if path else {}
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    raw.update(overrides or {})
    from_torchrun, problems = torchrun_values(raw)
    raw.update(from_torchrun)
    source = str(path) if path else None
    values: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
    training: dict[str, Any] = dict(TRAINING_DEFAULTS)
    refused: dict[str, Any] = {}
    ray_values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in GROUP_FIELDS:
            group, fld, annotation = GROUP_FIELDS[key]
            converted, problem = coerce(key, value, annotation, fld.metadata.get("choices"))
            if not problem:
                values[group][key] = converted
        elif key in TRAINING_KEYS:
            converted, problem = coerce(key, value, TRAINING_KEYS[key])
            if not problem:
                training[key] = converted
        elif key in UNSUPPORTED_KEYS:  # its default is what tuneline does anyway; others: one message, below
            if value != UNSUPPORTED_KEYS[key]:
                refused[key] = value
            problem = None
        elif key in RAY_KEYS:  # read together, below: one key turns Ray on for the others
            ray_values[key] = value
            problem = None
        else:
            problem = f"unknown key '{key}'{did_you_mean(key, ALL_KEYS)}"
        if problem:
            problems.append(problem)
    ray, ray_refusals = ray_settings(ray_values)
    problems += ray_refusals + refused_problems(refused, {
        key: REFUSED[key][1] if key in REFUSED else f"only its default, {UNSUPPORTED_KEYS[key]!r}, is accepted"
        for key in refused})
    if "do_train" not in raw and training.get("do_predict"):  # LLaMA-Factory's default: predict only
        training["do_train"] = False
    config = RunConfig(**{g: GROUPS[g](**v) for g, v in values.items()}, training=training, source=source, ray=ray)
    _fill_derived(config)
    problems += resolve_checkpointing(config) + ray_run_problems(config)
    problems += check_combinations(config, check_paths=check_paths) + (more_checks(config) if more_checks else [])
    if problems:
        raise ConfigError(problems, source=source)
    return config


def _fill_derived(config: RunConfig) -> None:
    """Defaults that depend on other keys."""
    ft, tr = config.finetuning, config.training
    if ft.lora_alpha is None:
        ft.lora_alpha = ft.lora_rank * 2
    if not tr.get("output_dir"):
        tr["output_dir"] = str(Path("saves") / f"{config.model_short_name}-{ft.stage}-{ft.finetuning_type}")
    if config.model.flash_attn == "fa2":
        config.model.attn_implementation = "flash_attention_2"
    elif config.model.flash_attn in ("sdpa", "disabled"):
        config.model.attn_implementation = "sdpa" if config.model.flash_attn == "sdpa" else "eager"
    if config.pipeline.mlflow_tracking_uri is None:
        config.pipeline.mlflow_tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
    if ft.precompute_ref is None:
        ft.precompute_ref = ft.stage in ("dpo", "kto") and ft.pref_loss not in ("orpo", "simpo")


def dump_config(config: RunConfig, path: str | Path) -> Path:
    """Write the resolved config as flat YAML (written to a temp name, then renamed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    header = f"# resolved by tuneline from {config.source or 'overrides'}; run with: tuneline train {path}\n"
    tmp.write_text(header + yaml.safe_dump(config.flat(), sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
    return path


