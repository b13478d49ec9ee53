"""The points of a sweep: a grid's cartesian product, or points drawn from ranges; each point's config checked.

    tuneline sweep CONFIG --grid learning_rate=1e-4,5e-5 pref_beta=0.1,0.3          (2 x 2 = 4 points)
    tuneline sweep CONFIG --grid learning_rate=1e-5:1e-3 lora_rank=8,16 --samples 6   (6 points drawn, seed 0)

Every point is checked before the first one trains, and each gets its own output_dir, run name and MLflow run."""

from __future__ import annotations

import itertools
import json
import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tuneline.config import RunConfig
from tuneline.config.loader import ALL_KEYS
from tuneline.config.secrets import is_secret
from tuneline.content.fingerprint import fingerprint
from tuneline.errors import ConfigError, UserError, did_you_mean
from tuneline.evaluation.metric_names import metric_problems
from tuneline.identity import keys
from tuneline.identity.settings import NOT_CONTENT
from tuneline.pipeline.preflight import checked_config

GRID_HELP = (
    "KEY=V1,V2,... : the values of one config key (typed as in YAML; KEY=[a, \"b,c\"] for values with commas); "
    "the points are the product of every key's values. KEY=LOW:HIGH : a range, drawn from by --samples: "
    "log-uniform when both ends are positive and HIGH is more than 10x LOW (learning rates), else uniform; "
    "integers when both ends are integers; drawn numbers keep 3 significant digits."
)
# What the sweep sets itself for each point, or what would make its points one and the same run.
NOT_SWEPT = {"output_dir": "the sweep gives each point its own output_dir, beside the config's",
             "pipeline_cache_dir": "the points share one cache: that is what makes them cheap"}
MAX_FOLDER = 100
_RANGE = re.compile(r"^\s*([^:\s]+)\s*:\s*([^:\s]+)\s*$")
_FOLDER_SAFE = re.compile(r"[^A-Za-z0-9._=+-]")


@dataclass(frozen=True)
class Range:
    """`low:high`, drawn log-uniform when both ends are positive and span more than 10x, else uniform."""

    low: float
    high: float
    integer: bool
    text: str = ""  # as written, for messages

    @property
    def log(self) -> bool:
        return self.low > 0 and self.high / self.low > 10

    def draw(self, rng: random.Random) -> float | int:
        if self.log:
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            value = rng.uniform(self.low, self.high)
        return round(value) if self.integer else float(f"{value:.3g}")

    def __str__(self) -> str:
        return self.text or f"{self.low:g}:{self.high:g}"


Axis = list | Range


@dataclass
class SweepPoint:
    values: dict[str, Any]  # the swept keys as the point's config resolved them
    label: str  # "learning_rate=0.0001 pref_beta=0.1"
    overrides: list[str]  # what the finetune flow gets: the sweep's overrides, the values, output_dir, run name
    config: RunConfig


def parse_grid_args(entries: list[str]) -> dict[str, str]:
    """`--grid` words (`key=values`) as {key: values text}; a key given twice is refused."""
    grid: dict[str, str] = {}
    problems = []
    for entry in entries:
        key, sep, text = entry.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(f"--grid '{entry}' is not of the form key=v1,v2 or key=low:high")
        elif key in grid:
            problems.append(f"--grid names '{key}' twice; give all its values at once: {key}=v1,v2")
        else:
            grid[key] = text
    if problems:
        raise ConfigError(problems, source="--grid")
    return grid


def _typed(text: str) -> Any:
    """A value as YAML types it, numbers in any notation as numbers (PyYAML reads 1e-4 as a string)."""
    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _parse_axis(key: str, spec: list | str) -> tuple[Axis | None, str | None]:
    if isinstance(spec, list):
        return (list(spec), None) if spec else (None, f"'{key}' has no values; give at least one: {key}=v1,v2")
    text = str(spec).strip()
    if not text:
        return None, f"'{key}' has no values; give at least one: {key}=v1,v2"
    found = _RANGE.match(text)
    if found:
        try:
            low, high = (yaml.safe_load(end) for end in found.groups())
            low, high = (v if isinstance(v, (int, float)) and not isinstance(v, bool) else float(v)
                         for v in (low, high))
        except (ValueError, TypeError, yaml.YAMLError):
            low = high = None  # not numbers: a plain value with a colon in it
        if low is not None:
            if not low < high:
                return None, f"'{key}={text}': a range's low end must be below its high end"
            return Range(float(low), float(high), isinstance(low, int) and isinstance(high, int), text), None
    try:
        if text.startswith("["):
            values = yaml.safe_load(text)
        else:
            words = text.split(",")
            if any(not word.strip() for word in words):
                return None, f"'{key}={text}' has an empty value between commas"
            values = [_typed(word.strip()) for word in words]
    except yaml.YAMLError as exc:
        return None, f"'{key}={text}' is not readable as YAML: {str(exc).splitlines()[0]}"
    if not isinstance(values, list) or not values:
        return None, f"'{key}={text}' has no values; give at least one: {key}=v1,v2"
    return values, None


def _key_problem(key: str) -> str | None:
    if key not in ALL_KEYS:
        return f"unknown key '{key}' in the grid{did_you_mean(key, ALL_KEYS)}"
    if is_secret(key):
        return f"'{key}' is a credential: its values are masked in MLflow, so its points could not be told apart"
    if key in NOT_SWEPT:
        return f"'{key}' cannot be swept: {NOT_SWEPT[key]}"
    if key in NOT_CONTENT:
        return f"'{key}' cannot be swept: it changes how a run is named, tracked or cached, not what it trains"
    return None


def parse_axes(grid: Mapping[str, list | str]) -> dict[str, Axis]:
    """{key: values or Range}, or a ConfigError naming every bad key and value at once."""
    if not grid:
        raise ConfigError("a sweep needs at least one grid key: --grid key=v1,v2", source="--grid")
    axes, problems = {}, []
    for key, spec in grid.items():
        problem = _key_problem(key)
        axis = None
        if problem is None:
            axis, problem = _parse_axis(key, spec)
        if problem:
            problems.append(problem)
        else:
            axes[key] = axis
    if problems:
        raise ConfigError(problems, source="--grid")
    return axes


def grid_points(axes: dict[str, Axis], samples: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """Every combination of the values (samples unset), or `samples` distinct points drawn with `seed`."""
    ranges = [key for key, axis in axes.items() if isinstance(axis, Range)]
    if samples is None:
        if ranges:
            raise ConfigError([f"'{key}={axes[key]}' is a range: set --samples N to draw N points from it, or "
                               f"list values ({key}=v1,v2)" for key in ranges], source="--grid")
        return [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*axes.values())]
    if samples < 1:
        raise ConfigError(f"--samples is {samples}; allowed: 1 or more (or leave it out for the whole grid)")
    if not ranges:
        size = math.prod(len(axis) for axis in axes.values())
        if samples > size:
            raise ConfigError(f"--samples {samples} is more than the {size} points the grid holds; leave --samples "
                              "out to run them all")
    rng, points, seen = random.Random(seed), [], set()
    for _ in range(100 * samples):
        point = {key: rng.choice(axis) if isinstance(axis, list) else axis.draw(rng) for key, axis in axes.items()}
        signature = json.dumps(point, sort_keys=True, default=str)
        if signature not in seen:
            seen.add(signature)
            points.append(point)
            if len(points) == samples:
                return points
    raise ConfigError(f"--samples {samples}: only {len(points)} distinct points could be drawn from these ranges; "
                      "widen them or ask for fewer")


def _text(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def point_label(values: Mapping[str, Any]) -> str:
    return " ".join(f"{key}={_text(value)}" for key, value in values.items())


def point_folder(values: Mapping[str, Any]) -> str:
    """A folder name that reads as the point; a hash keeps it unique where characters had to be replaced."""
    raw = "_".join(f"{key}={_text(value)}" for key, value in values.items())
    safe = _FOLDER_SAFE.sub("_", raw)
    if safe == raw and len(raw) <= MAX_FOLDER:
        return raw
    return f"{safe[:MAX_FOLDER - 9]}-{fingerprint(raw)[:8]}"


def sweep_output_root(base: RunConfig) -> Path:
    """Beside the config's output_dir (inside, it would leave that folder looking like another run's)."""
    return Path(f"{str(base.output_dir).rstrip('/')}-sweep")


def _parallel_problems(config: RunConfig, max_parallel: int) -> list[str]:
    if max_parallel > 1 and config.pipeline.reward_model_config:
        return [f"'reward_model_config' trains the reward model inside each point's flow, and with --max-parallel "
                f"{max_parallel} the points would train it at once in one output_dir: use --max-parallel 1 (the "
                "first point trains it, the others find it cached), or set 'reward_model' to the trained model"]
    return []


def _point(base: RunConfig, overrides: list[str], values: dict[str, Any]) -> tuple[list[str], str]:
    """The finetune flow's overrides for one point (the values win over the sweep's own), and its label."""
    label = point_label(values)
    output_dir = sweep_output_root(base) / point_folder(values)
    return [*overrides, *(f"{key}={json.dumps(value)}" for key, value in values.items()),
            f"output_dir={json.dumps(str(output_dir))}", f"run_name={json.dumps(f'{base.run_name} {label}')}",
            f"mlflow_experiment={json.dumps(base.experiment_name)}"], label


def plan_sweep(config_path: str, grid: Mapping[str, list | str], samples: int | None = None, seed: int = 0,
               overrides: list[str] | None = None, metric: str = "eval_loss",
               max_parallel: int = 1) -> list[SweepPoint]:
    """Every point with its checked config, or one UserError naming every bad key, value and point.

    Children keep the base config's MLflow experiment, so the parent and its children sit side by side in the UI."""
    if max_parallel < 1:
        raise ConfigError(f"--max-parallel is {max_parallel}; allowed: 1 or more")
    overrides = list(overrides or [])
    base = checked_config(config_path, overrides)
    points = grid_points(parse_axes(grid), samples, seed)
    planned, problems = [], {}
    for values in points:
        point_overrides, label = _point(base, overrides, values)
        try:
            config = checked_config(config_path, point_overrides)
        except UserError as error:
            for problem in error.problems:
                problems.setdefault(problem, label)
            continue
        for problem in metric_problems(config, metric) + _parallel_problems(config, max_parallel):
            problems.setdefault(problem, label)
        resolved = config.flat()
        planned.append(SweepPoint({key: resolved.get(key) for key in values}, label, point_overrides, config))
    if problems:
        raise ConfigError([f"{problem} (point {label})" for problem, label in problems.items()],
                          source=f"{config_path} (sweep)")
    return planned


def shares_reward_model_steps(config: RunConfig) -> bool:
    """Whether a point's reference and base evaluation can be built before it starts: not while its reward model
    is still to be trained by its own flow (`reward_model_config`), since ppo's evaluation scores with it."""
    return not config.pipeline.reward_model_config


def shared_steps_key(config: RunConfig) -> tuple[str, ...]:
    """Points with equal keys share their tokenizer, dataset, reference log-probs and base-model evaluation:
    the steps no training key changes, built once before the points start."""

    data = keys.dataset_key(config)
    if not shares_reward_model_steps(config):
        return (data,)
    return data, keys.reference_key(config, data), keys.evaluation_key(config, keys.base_model_key(config), data)
