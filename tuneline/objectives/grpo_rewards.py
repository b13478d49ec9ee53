"""grpo's `reward_funcs`, resolved to what trl's GRPOTrainer calls, and checked before anything trains.

One resolution serves the training child and the flow's `evaluate` step, so before and after are scored by the
same functions. A reward model folder becomes a plain function over the policy's tokens (`tuneline.objectives.rewards` reads
tuneline's and LLaMA-Factory's rm outputs one way): trl's own reward-model path would re-tokenize the text with the
reward model's tokenizer and read a value-head model's first token."""

from __future__ import annotations

import copy
import importlib.util
import inspect
from collections.abc import Callable
from pathlib import Path

from tuneline.config.grpo_keys import BUILTIN_REWARDS, GRPO_STAGES, builtin_reward, reward_function_path
from tuneline.errors import ConfigError, did_you_mean

# what trl passes every reward function besides the dataset's columns (`solution` here)
TRL_REWARD_KWARGS = ("prompts", "completions", "completion_ids", "solution", "trainer_state", "log_extra",
                     "log_metric")


def reward_funcs_problems(config) -> list[str]:
    """Every `reward_funcs` item that cannot be called: unknown names, missing files or functions, wrong signatures,
    a built-in whose package is missing."""
    if config.stage not in GRPO_STAGES:
        return []
    return [problem for item in config.grpo.reward_funcs or [] if (problem := item_problem(str(item)))]


def item_problem(item: str) -> str:
    builtin = builtin_reward(item)
    if builtin is not None:
        if builtin[1] and importlib.util.find_spec("math_verify") is None:
            return f"'reward_funcs' item '{item}' needs the math-verify package: pip install 'tuneline[math]'"
        return ""
    located = reward_function_path(item)
    if located is not None:
        return load_user_function(*located)[1]
    folder = Path(item)
    if folder.is_dir():
        if (folder / "config.json").is_file() or (folder / "adapter_config.json").is_file():
            return ""
        return (f"'reward_funcs' item '{item}' is a folder without a model (no config.json or adapter_config.json); "
                "point it at the output_dir of a stage: rm run")
    if "/" in item or "\\" in item or item.endswith(".py"):
        return (f"'reward_funcs' item '{item}' does not exist: give a reward model folder, or a function as "
                "'path/to/file.py:function'")
    return (f"'reward_funcs' item '{item}' is not a built-in reward{did_you_mean(item, BUILTIN_REWARDS)}; use one "
            f"of {', '.join(BUILTIN_REWARDS)}, 'path/to/file.py:function' or a reward model folder")


def load_user_function(file: str, name: str) -> tuple[Callable | None, str]:
    """(the function `name` of the Python file, "") or (None, why trl could not call it with its keyword arguments)."""
    where = f"'reward_funcs' item '{file}:{name}'"
    path = Path(file)
    if not path.is_file():
        return None, f"{where}: the file '{file}' does not exist"
    spec = importlib.util.spec_from_file_location(f"tuneline_reward_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001  (the user's file: any error it raises is theirs to fix)
        return None, f"{where}: importing '{file}' failed: {type(exc).__name__}: {exc}"
    function = getattr(module, name, None)
    if not callable(function):
        found = [n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")]
        return None, f"{where}: '{file}' defines no function '{name}'{did_you_mean(name, found)}"
    try:
        inspect.signature(function).bind(**dict.fromkeys(TRL_REWARD_KWARGS))
    except TypeError as exc:
        return None, (f"{where}: trl calls it as {name}(prompts=..., completions=..., solution=..., **kwargs) and it "
                      f"cannot take that ({exc}); define it as def {name}(completions, **kwargs)")
    return function, ""


def resolve_reward_funcs(config, tokenizer, device=None) -> tuple[list[Callable], list[str]]:
    """(callables, names) for trl's GRPOTrainer and for the evaluate step, in `reward_funcs` order."""
    funcs, names = [], []
    for item in (str(i) for i in config.grpo.reward_funcs or []):
        problem = item_problem(item)
        if problem:
            raise ConfigError(problem)
        builtin, located = builtin_reward(item), reward_function_path(item)
        if builtin is not None:
            func, name = builtin_function(builtin[0]), item.removesuffix("_reward")
        elif located is not None:
            func, name = load_user_function(*located)[0], located[1]
        else:
            func, name = reward_model_function(config, item, tokenizer, device), Path(item).name
        funcs.append(func)
        names.append(unique_name(name, names))
    return funcs, names


def builtin_function(name: str) -> Callable:
    """A trl.rewards function, fed as it expects: trl's built-ins read chat-style completions
    ([{"role": "assistant", "content": ...}]), while tuneline's prompts are the template's text, so trl hands over
    plain strings."""
    import trl.rewards

    function = getattr(trl.rewards, name)

    def builtin(completions, **kwargs) -> list[float | None]:
        return function([[{"role": "assistant", "content": c}] for c in completions], **kwargs)

    builtin.__name__ = name
    return builtin


def unique_name(name: str, taken: list[str]) -> str:
    candidate, n = name, 2
    while candidate in taken:
        candidate, n = f"{name}_{n}", n + 1
    return candidate


def reward_model_function(config, folder: str, tokenizer, device=None) -> Callable:
    """A reward model folder as a reward function: the score of prompt + completion, read as ppo reads it."""
    import torch

    from tuneline.objectives.rewards import load_reward_model, sequence_scores

    rcfg = copy.deepcopy(config)
    rcfg.finetuning.reward_model = folder
    rcfg.finetuning.reward_model_type = "lora" if (Path(folder) / "adapter_config.json").is_file() else "full"
    model = load_reward_model(rcfg, tokenizer)
    if device is not None:
        model = model.to(device)

    def reward_model(prompts, completions, **_kwargs) -> list[float]:
        texts = [p + c for p, c in zip(prompts, completions, strict=True)]
        batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
        batch = batch.to(next(model.parameters()).device)
        with torch.inference_mode():
            return sequence_scores(model, batch["input_ids"], batch["attention_mask"]).float().tolist()

    reward_model.__name__ = Path(folder).name
    return reward_model


def grpo_machine_problems(config, cuda: bool) -> list[str]:
    """What a grpo run needs from this machine and its packages: callable rewards, and vLLM only where it runs."""
    if config.stage not in GRPO_STAGES:
        return []
    problems = reward_funcs_problems(config)
    if config.grpo.use_vllm and not cuda:
        problems.append("'use_vllm: true' generates with vLLM, which needs a CUDA GPU and there is none here (or "
                        "'use_cpu' is set); remove it: answers are then generated by transformers")
    elif config.grpo.use_vllm and importlib.util.find_spec("vllm") is None:
        problems.append("'use_vllm: true' needs the vllm package: pip install 'tuneline[vllm]'")
    return problems
