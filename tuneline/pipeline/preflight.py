"""Everything about a run that can be checked from its config, its files and this machine, before Prefect or any
process starts, so a run that cannot work is refused with one message instead of failing later."""

from __future__ import annotations

import copy
import functools
import json
import os
from pathlib import Path

from tuneline.config import RunConfig, load_config
from tuneline.config.optimizer_keys import optimizer_problems
from tuneline.config.ray_keys import unreachable_paths
from tuneline.config.secrets import is_secret
from tuneline.config.validate import badam_problems
from tuneline.data.stop_words import stop_word_problem
from tuneline.data.template_catalog import AUTO, TEMPLATES, VISION
from tuneline.data.tools import TOOL_FORMATS
from tuneline.data.unbuilt_templates import unbuilt_template_problem
from tuneline.errors import DataError, did_you_mean
from tuneline.hub.publish import hub_token_problems
from tuneline.objectives.grpo_rewards import grpo_machine_problems
from tuneline.runtime.devices import gpu_count
from tuneline.runtime.ray_cluster import cluster_problems
from tuneline.runtime.requirements import missing_requirements


def checked_config(path: str | Path | None, overrides: list[str] | dict | None = None,
                   machine: bool = True) -> RunConfig:
    """The config, or a ConfigError listing every problem found. Memoised per file content and overrides (the command,
    the flow run's name and the flow all ask); each caller gets its own copy, free to change.

    `machine=False` leaves out what only the machine that trains can answer (its devices and libraries, the model's
    files, the Ray cluster): `tuneline trigger` runs on a laptop, the run on a worker that has them."""
    where = (os.getcwd(), _file_stamp(path))  # relative paths in it are read from the working folder
    return copy.deepcopy(_checked(None if path is None else str(path), json.dumps(overrides, default=str), where,
                                  machine))


def _file_stamp(path: str | Path | None) -> tuple[int, int] | None:
    try:
        stat = Path(path).stat() if path is not None else None
    except OSError:  # a missing file: load_config says so
        return None
    return (stat.st_mtime_ns, stat.st_size) if stat else None


@functools.lru_cache(maxsize=16)
def _checked(path: str | None, overrides_json: str, where: tuple, machine: bool) -> RunConfig:
    overrides = json.loads(overrides_json)
    given = secret_override_problems(overrides)
    if not machine:
        return load_config(path, overrides, check_paths=False, more_checks=lambda config: given)
    return load_config(path, overrides, more_checks=lambda config: given + machine_and_library_problems(config))


def secret_override_problems(overrides: list[str] | dict | None) -> list[str]:
    """A credential given as `key=value` becomes a parameter of the Prefect flow run, which Prefect stores and
    shows: refused, with where to put it instead (the value is never quoted)."""
    items = overrides if isinstance(overrides, list) else []
    keys = [item.split("=", 1)[0].strip() for item in items if isinstance(item, str) and "=" in item]
    return [f"'{key}' is a credential given on the command line, where Prefect would store it with the flow "
            "run's parameters: put it in the config file, or for the Hugging Face Hub set HF_TOKEN (or run "
            "`hf auth login`)" for key in keys if is_secret(key)]


def machine_and_library_problems(config: RunConfig) -> list[str]:
    if config.ray is not None:  # what the Ray workers get, wherever they run
        from tuneline.pipeline.ray_launch import workers_use_gpus

        cuda = workers_use_gpus(config)
    else:
        cuda = gpu_count() > 0 and not config.training.get("use_cpu")
    problems = (template_problems(config) + missing_requirements(config, cuda) + hub_token_problems(config)
                + hub_media_problems(config))
    problems += grpo_machine_problems(config, cuda) + cluster_problems(config) + unreachable_paths(config)
    if cuda and not config.pipeline.num_processes and not badam_problems(config):  # one process per GPU
        problems += badam_problems(config, gpu_count())
    if cuda and not config.pipeline.num_processes and not optimizer_problems(config):
        problems += optimizer_problems(config, gpu_count())
    return problems


def hub_media_problems(config: RunConfig) -> list[str]:
    """Hub entries with images or videos whose local copy is missing (LLaMA-Factory's `rlhf_v`), and entries with
    videos for a template that reads none, said before the flow starts (before the build decodes every video);
    every other entry problem is the build step's to report."""
    from tuneline.data.mm import get_mm_plugin
    from tuneline.data.mm.requirements import video_requirements_problem
    from tuneline.data.registry import parse_entry, read_info, remote_media_problem

    names = config.dataset_names + config.eval_dataset_names
    try:
        info = read_info(config.data.dataset_dir) if names else {}
        attrs = [parse_entry(name, info[name]) for name in names if name in info]
    except DataError:
        return []
    problems = [problem for attr in attrs if (problem := remote_media_problem(attr, config.data.dataset_dir))]
    problems += [problem for attr in attrs
                 if attr.videos and (problem := video_template_problem(attr.name, config.data.template))]
    template = TEMPLATES.get(config.data.template or "")
    needs_torchvision = template is None or get_mm_plugin(template.mm_plugin).videos_need_torchvision
    if any(attr.videos for attr in attrs) and (problem := video_requirements_problem(needs_torchvision)):
        problems.append(problem)
    return problems


def video_template_problem(dataset: str, template: str) -> str | None:
    """Why a dataset with a `videos` column cannot run with this template (its plugin, as LLaMA-Factory's, has no
    video token: llava, gemma3, text templates), or None."""
    from tuneline.data.mm import get_mm_plugin
    from tuneline.data.mm.run_media import video_templates

    plugin = get_mm_plugin(TEMPLATES[template].mm_plugin) if template in TEMPLATES else None
    if plugin is None or plugin.video_token:
        return None
    why = plugin.unencoded_videos or "reads no videos (LLaMA-Factory's plugin for it has no video token either)"
    return (f"dataset '{dataset}' has a 'videos' column, but 'template: {template}' {why}; use a template whose model "
            f"reads videos "
            f"({', '.join(video_templates())}), or remove 'videos' from the entry's columns in dataset_info.json")


def template_problems(config: RunConfig) -> list[str]:
    data, problems = config.data, []
    if data.template not in AUTO and data.template not in TEMPLATES:
        problems.append(unbuilt_template_problem(data.template, VISION) or
                        f"'template: {data.template}' is not known{did_you_mean(data.template, TEMPLATES)}; use one "
                        f"of {', '.join(sorted(TEMPLATES))}, or 'auto' for the tokenizer's own chat template")
    elif data.template in TEMPLATES:
        problems.append(stop_word_problem(TEMPLATES[data.template], config.model))
    if data.tool_format and data.tool_format not in TOOL_FORMATS:
        problems.append(f"'tool_format: {data.tool_format}' is not known{did_you_mean(data.tool_format, TOOL_FORMATS)}; "
                        f"use one of {', '.join(sorted(TOOL_FORMATS))}")
    if config.model.image_do_pan_and_scan and (data.template in AUTO or data.template in TEMPLATES):
        problems.append(pan_and_scan_problem(TEMPLATES[data.template].mm_plugin if data.template in TEMPLATES
                                             else None))
    if config.model.crop_to_patches and (data.template in AUTO or data.template in TEMPLATES):
        problems.append(crop_to_patches_problem(TEMPLATES[data.template].mm_plugin if data.template in TEMPLATES
                                                else None))
    if data.tool_date and not _is_tool_date(data.tool_date):
        problems.append(f"'tool_date: {data.tool_date}' is not a date as llama3's tool prompt writes it; "
                        "use day, month abbreviation and year, e.g. '26 Jul 2024'")
    return [problem for problem in problems if problem]


def pan_and_scan_problem(plugin_name: str | None) -> str | None:
    """Pan and scan is Gemma 3's: LLaMA-Factory ignores the key under other templates, tuneline refuses it."""
    from tuneline.data.mm.plugins import get_mm_plugin
    from tuneline.data.mm.run_media import pan_and_scan_refusal

    return None if get_mm_plugin(plugin_name).pans_and_scans else pan_and_scan_refusal(plugin_name)


def crop_to_patches_problem(plugin_name: str | None) -> str | None:
    """Tiling is InternVL's: LLaMA-Factory ignores the key under other templates, tuneline refuses it."""
    from tuneline.data.mm.plugins import get_mm_plugin
    from tuneline.data.mm.run_media import crop_to_patches_refusal

    return None if get_mm_plugin(plugin_name).crops_to_patches else crop_to_patches_refusal(plugin_name)


def _is_tool_date(text: str) -> bool:
    from datetime import datetime

    try:
        return datetime.strptime(str(text), "%d %b %Y").strftime("%d %b %Y") == str(text)
    except ValueError:
        return False
