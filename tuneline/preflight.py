"""Everything about a run that can be checked from its config, its files and this machine, before Prefect or any
process starts: the keys (`load_config`), the template, and the packages and devices the config needs.

`tuneline validate`, `tuneline train`, `python -m flows.finetune` and the flow itself (a served deployment enters
there) all start with it, so a run that cannot work is refused with one message instead of failing later.
"""

from __future__ import annotations

from pathlib import Path

from tuneline.config import RunConfig, load_config
from tuneline.config.validate import badam_problems
from tuneline.data.template_catalog import AUTO, TEMPLATES
from tuneline.data.tools import TOOL_FORMATS
from tuneline.devices import gpu_count
from tuneline.errors import did_you_mean
from tuneline.publish import hub_token_problems
from tuneline.requirements import missing_requirements


def checked_config(path: str | Path | None, overrides: list[str] | dict | None = None) -> RunConfig:
    """The config, or a ConfigError listing every problem found, the config's own and these."""
    return load_config(path, overrides, more_checks=machine_and_library_problems)


def machine_and_library_problems(config: RunConfig) -> list[str]:
    cuda = gpu_count() > 0 and not config.training.get("use_cpu")
    problems = template_problems(config) + missing_requirements(config, cuda) + hub_token_problems(config)
    if cuda and not config.pipeline.num_processes and not badam_problems(config):  # one process per GPU
        problems += badam_problems(config, gpu_count())
    return problems


def template_problems(config: RunConfig) -> list[str]:
    data, problems = config.data, []
    if data.template not in AUTO and data.template not in TEMPLATES:
        problems.append(f"'template: {data.template}' is not known{did_you_mean(data.template, TEMPLATES)}; use one "
                        f"of {', '.join(sorted(TEMPLATES))}, or 'auto' for the tokenizer's own chat template")
    if data.tool_format and data.tool_format not in TOOL_FORMATS:
        problems.append(f"'tool_format: {data.tool_format}' is not known{did_you_mean(data.tool_format, TOOL_FORMATS)}; "
                        f"use one of {', '.join(sorted(TOOL_FORMATS))}")
    return problems
