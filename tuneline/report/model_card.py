"""The run's README.md: Hugging Face model-card front matter, then setup, data, results, plots and how to load."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import os
import platform
from pathlib import Path
from typing import Any

import yaml

from tuneline.config.args import ADAPTER_TYPES, GROUPS
from tuneline.config.secrets import MASK, is_secret
from tuneline.config.training_keys import TRAINING_DEFAULTS

FRAMEWORKS = ("tuneline", "torch", "transformers", "peft", "accelerate", "datasets", "tokenizers",
              "mlflow", "prefect")
# Keys that say where things live on this machine, not how the model was trained.
NOT_HYPERPARAMETERS = {"mlflow_tracking_uri", "pipeline_cache_dir", "refresh_cache", "hf_hub_token"}
REMOTE_CODE_NOTE = (" Loaded with `trust_remote_code: true`: the Python code in the model's repository ran, and "
                    "loading this model runs it again.")
LOWER_IS_BETTER = {"eval_loss", "perplexity"}


def framework_versions() -> dict[str, str]:
    """Installed versions of the packages that shape a run (absent ones left out), plus Python."""
    versions = {"python": platform.python_version()}
    for name in FRAMEWORKS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def non_default_settings(config) -> dict[str, Any]:
    """Keys whose value differs from tuneline's default (secrets masked): what the user chose."""
    defaults: dict[str, Any] = dict(TRAINING_DEFAULTS)
    for cls in GROUPS.values():
        for fld in dataclasses.fields(cls):
            has_factory = fld.default_factory is not dataclasses.MISSING
            defaults[fld.name] = fld.default_factory() if has_factory else fld.default
    chosen = {k: v for k, v in sorted(config.flat().items())
              if k not in NOT_HYPERPARAMETERS and (k not in defaults or defaults[k] != v)}
    return {k: (MASK if v and is_secret(k) else v) for k, v in chosen.items()}


def front_matter(config) -> dict[str, Any]:
    lora = config.finetuning.finetuning_type in ADAPTER_TYPES
    return {
        "base_model": str(config.model.model_name_or_path),
        "library_name": "peft" if lora else "transformers",
        "license": config.flat().get("license") or "other",
        "tags": ["tuneline", config.stage, config.finetuning.finetuning_type],
        "datasets": config.dataset_names + [n for n in config.eval_dataset_names if n not in config.dataset_names],
        "pipeline_tag": "text-generation",
    }


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def results_table(base: dict[str, float], tuned: dict[str, float]) -> str:
    lines = ["| metric | base | tuned | change |", "|---|---|---|---|"]
    for name in sorted(set(base) | set(tuned)):
        before, after = base.get(name), tuned.get(name)
        change = "–"
        if isinstance(before, (int, float)) and isinstance(after, (int, float)) and math.isfinite(after - before):
            better = after < before if name in LOWER_IS_BETTER else after > before
            change = f"{after - before:+.4g}" + (" (better)" if better else "")
        lines.append(f"| {name} | {_cell(before) if before is not None else '–'} | "
                     f"{_cell(after) if after is not None else '–'} | {change} |")
    return "\n".join(lines)


def settings_table(settings: dict[str, Any]) -> str:
    rows = [f"| {k} | {_cell(v)} |" for k, v in settings.items()]
    return "\n".join(["| key | value |", "|---|---|", *rows])


def load_snippet(config, out_dir: Path) -> str:
    base, here = config.model.model_name_or_path, str(out_dir)
    if config.finetuning.finetuning_type in ADAPTER_TYPES:
        body = ("from peft import PeftModel\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
                f"base = AutoModelForCausalLM.from_pretrained({base!r})\n"
                f"model = PeftModel.from_pretrained(base, {here!r})\n"
                f"tokenizer = AutoTokenizer.from_pretrained({base!r})\n")
    else:
        body = ("from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
                f"model = AutoModelForCausalLM.from_pretrained({here!r})\n"
                f"tokenizer = AutoTokenizer.from_pretrained({base!r})\n")
    return f"```python\n{body}```"


def _plots_section(plots: list[str], out_dir: Path) -> str:
    if not plots:
        return "No training curves were recorded."
    return "\n\n".join(f"![{Path(p).stem}]({Path(os.path.relpath(p, out_dir)).as_posix()})" for p in plots)


def write_model_card(config, out_dir: str | os.PathLike, *, base_metrics: dict, tuned_metrics: dict,
                     dataset_fingerprints: dict, plots: list[str], mlflow_run: str | None,
                     framework_versions: dict | None = None, not_evaluated: str | None = None,
                     image_answers: str | None = None) -> str:
    """Write `<out_dir>/README.md` and return its path; `mlflow_run` is the Markdown link to the run (None when
    untracked); `not_evaluated` says why there are no results; `image_answers` is the held-out images section
    (`tuneline.report.image_answers`), for a vision-language model."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    versions = framework_versions if framework_versions is not None else _installed_versions()
    ft = config.finetuning
    sections = [
        "---\n" + yaml.safe_dump(front_matter(config), sort_keys=False, allow_unicode=True) + "---",
        f"# {config.run_name}",
        f"`{config.model.model_name_or_path}` fine-tuned by tuneline (stage `{ft.stage}`, "
        f"{ft.finetuning_type}) on {', '.join(f'`{n}`' for n in config.dataset_names) or 'no dataset'}."
        + (REMOTE_CODE_NOTE if config.model.trust_remote_code else ""),
        "## Training setup\n\nSettings that differ from tuneline's defaults:\n\n" + settings_table(
            non_default_settings(config)),
        "## Data\n\n" + settings_table({f"`{k}`": v for k, v in sorted(dataset_fingerprints.items())}).replace(
            "| key | value |", "| dataset | fingerprint |"),
        "## Results\n\n" + (f"Not evaluated: {not_evaluated}." if not_evaluated else
                             "Validation split, base model before training vs the tuned model (lower is better for "
                             "eval_loss and perplexity).\n\n" + results_table(base_metrics, tuned_metrics)),
        *([f"## Held-out images\n\n{image_answers}"] if image_answers else []),
        "## Training curves\n\n" + _plots_section(plots, out_dir),
        "## Tracking\n\n" + (f"MLflow run: {mlflow_run}" if mlflow_run else "This run was not tracked in MLflow."),
        "## Framework versions\n\n" + "\n".join(f"- {k} {v}" for k, v in versions.items()),
        "## How to load\n\n" + load_snippet(config, out_dir),
    ]
    path = out_dir / "README.md"
    tmp = out_dir / f".README.md.{os.getpid()}.tmp"
    tmp.write_text("\n\n".join(sections) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return str(path)


_installed_versions = framework_versions  # the keyword argument of write_model_card shadows the function
