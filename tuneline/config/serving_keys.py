"""LLaMA-Factory's serving keys (`infer_backend` and the `vllm_*` engine keys), read by `tuneline api` only.

They say how a trained model is served, not how it trains, so they are taken out of a config before it is loaded
as a run config: the same YAML trains with `tuneline train` and serves with `tuneline api`. `sglang` is refused by
name, and `vllm` is refused before anything loads unless CUDA and the `vllm` package are both here."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, fields

from tuneline.config.fields import arg


@dataclass
class ServingArgs:
    infer_backend: str = arg("huggingface", "api: the engine that generates (vllm: CUDA with vLLM installed).",
                             ("huggingface", "vllm", "sglang"))
    vllm_maxlen: int = arg(4096, "api, vllm: most tokens of prompt plus answer the engine holds (max_model_len).")
    vllm_gpu_util: float = arg(0.7, "api, vllm: fraction of GPU memory the engine may take, in (0, 1).")
    vllm_enforce_eager: bool = arg(False, "api, vllm: no CUDA graphs (less memory, slower).")
    vllm_max_lora_rank: int = arg(32, "api, vllm: the largest LoRA rank the engine serves.")
    vllm_config: dict | None = arg(None, "api, vllm: more vLLM engine arguments, a mapping (or its JSON text).")


SERVING_KEYS = tuple(f.name for f in fields(ServingArgs))
SERVING_DEFAULTS = {f.name: f.default for f in fields(ServingArgs)}
VLLM_KEYS = tuple(key for key in SERVING_KEYS if key.startswith("vllm_"))


def split_serving_keys(raw: dict) -> tuple[ServingArgs, dict, list[str]]:
    """(the serving keys, the rest of the config, problems): each serving key typed and checked, every problem
    named at once."""
    from tuneline.config.coerce import coerce

    values, rest, problems = {}, {}, []
    for key, value in raw.items():
        if key not in SERVING_KEYS:
            rest[key] = value
            continue
        if key == "vllm_config":
            converted, problem = _engine_mapping(value)
        else:
            spec = next(f for f in fields(ServingArgs) if f.name == key)
            converted, problem = coerce(key, value, type(SERVING_DEFAULTS[key]), spec.metadata.get("choices"))
        if problem:
            problems.append(problem)
        else:
            values[key] = converted
    serving = ServingArgs(**values)
    problems += _value_problems(serving, set(values))
    return serving, rest, problems


def _engine_mapping(value) -> tuple[dict | None, str | None]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            return None, f"'vllm_config' is not JSON ({exc.msg}); give a mapping of vLLM engine arguments"
    if value is not None and not isinstance(value, dict):
        return None, f"'vllm_config' must be a mapping of vLLM engine arguments, not {type(value).__name__}"
    return value, None


def _value_problems(serving: ServingArgs, given: set[str]) -> list[str]:
    problems = []
    if serving.infer_backend == "sglang":
        problems.append("'infer_backend: sglang' is not supported; use 'huggingface' (any machine) or 'vllm' (CUDA "
                        "with vLLM installed)")
    if serving.infer_backend != "vllm":
        problems += [f"'{key}: {getattr(serving, key)}' applies only with 'infer_backend: vllm'; remove it"
                     for key in VLLM_KEYS if key in given and getattr(serving, key) != SERVING_DEFAULTS[key]]
    if not 0 < serving.vllm_gpu_util < 1:
        problems.append(f"'vllm_gpu_util' ({serving.vllm_gpu_util}) must be between 0 and 1")
    if serving.vllm_maxlen < 1 or serving.vllm_max_lora_rank < 1:
        problems.append("'vllm_maxlen' and 'vllm_max_lora_rank' must be positive")
    return problems


def backend_problems(serving: ServingArgs, cuda_available: bool | None = None) -> list[str]:
    """What this machine lacks for the chosen backend, each with the fix ([] when it can start)."""
    if serving.infer_backend != "vllm":
        return []
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    problems = []
    if not cuda_available:
        problems.append("'infer_backend: vllm' needs a CUDA GPU, and this machine has none; use 'infer_backend: "
                        "huggingface'")
    if importlib.util.find_spec("vllm") is None:
        problems.append("'infer_backend: vllm' needs the vllm package, which is not installed; `pip install vllm` "
                        "on a CUDA machine, or use 'infer_backend: huggingface'")
    return problems


def vllm_engine_args(serving: ServingArgs, model: str, adapters: list[str]) -> dict:
    """The keyword arguments of `vllm.LLM` LLaMA-Factory's keys stand for; `vllm_config` entries win."""
    engine = {"model": model, "max_model_len": serving.vllm_maxlen, "gpu_memory_utilization": serving.vllm_gpu_util,
              "enforce_eager": serving.vllm_enforce_eager}
    if adapters:
        engine.update(enable_lora=True, max_lora_rank=serving.vllm_max_lora_rank)
    return {**engine, **(serving.vllm_config or {})}
