"""Checks that span several keys or touch the file system. Each returns problems, never raises."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import yaml

from tuneline.config.args import DataArgs
from tuneline.config.feature_keys import feature_problems
from tuneline.config.grpo_keys import grpo_problems
from tuneline.config.optimizer_keys import optimizer_problems, zero_stage
from tuneline.config.ppo_keys import ppo_problems
from tuneline.config.run_config import RunConfig
from tuneline.config.safety import safety_problems
from tuneline.config.scope import scope_problems
from tuneline.errors import did_you_mean
from tuneline.runtime.fsdp_setup import read_accelerate_file

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


# Numeric keys and the values they allow (None: unbounded); a key left unset (None) is not checked.
RANGES: dict[str, tuple[float | None, float | None, str]] = {
    **{key: (1, None, "at least 1") for key in (
        "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps", "max_samples",
        "num_processes", "preprocessing_batch_size", "preprocessing_num_workers", "eval_max_new_tokens",
        "max_new_tokens", "lora_alpha", "ppo_epochs", "ppo_buffer_size", "save_total_limit", "num_beams",
        "export_size")},
    **{key: (0, None, "at least 0") for key in (
        "learning_rate", "warmup_steps", "weight_decay", "max_grad_norm", "eval_max_samples", "pref_ftx",
        "dataloader_num_workers", "kto_chosen_weight", "kto_rejected_weight", "eaft_alpha", "asft_alpha",
        "profiler_wait_steps", "profiler_warmup_steps", "profiler_repeat")},
    "profiler_active_steps": (1, None, "at least 1"),
    "model_max_length": (2, None, "at least 2"),
    **{key: (1, None, "at least 1") for key in (
        "image_max_pixels", "image_min_pixels", "video_max_pixels", "video_min_pixels", "video_maxlen")},
    **{key: (1e-12, None, "above 0") for key in (
        "video_fps", "num_train_epochs", "pref_beta", "logging_steps", "save_steps", "eval_steps", "temperature",
        "repetition_penalty")},
    "warmup_ratio": (0, 1, "between 0 and 1"),
    "lora_dropout": (0, 0.999999, "at least 0 and below 1"),
    "top_p": (1e-12, 1, "above 0 and at most 1"),
}


def check_ranges(config: RunConfig) -> list[str]:
    """Every numeric key within what it allows; `max_steps` is -1 (train for num_train_epochs) or at least 1."""
    flat = config.flat()
    problems = []
    for key, (low, high, allowed) in RANGES.items():
        value = flat.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and (
                (low is not None and value < low) or (high is not None and value > high)):
            problems.append(f"'{key}' is {value}; it must be {allowed}")
    for kind in ("image", "video"):
        low, high = flat.get(f"{kind}_min_pixels"), flat.get(f"{kind}_max_pixels")
        if isinstance(low, int) and isinstance(high, int) and high < low:
            problems.append(f"'{kind}_max_pixels' ({high}) is below '{kind}_min_pixels' ({low}); raise the first "
                            "or lower the second")
    steps = flat.get("max_steps")
    if isinstance(steps, int) and steps != -1 and steps < 1:
        problems.append(f"'max_steps' is {steps}; use -1 (train for num_train_epochs) or a step count of at least 1")
    return problems


def check_combinations(config: RunConfig, check_paths: bool = True) -> list[str]:
    problems = _check_keys(config) + check_ranges(config) + machines_problems(config)
    if check_paths:
        problems += check_model_paths(config) + check_reward_model_config(config)
        problems += check_datasets(config)
    return problems


def machines_problems(config: RunConfig) -> list[str]:
    """Several machines need the main one's address, a rank within their number and one port every machine knows
    (accelerate's free-port choice would differ per machine); tuneline's keys say the rank, so `train-node` can."""
    pipe, problems = config.pipeline, []
    if pipe.num_machines < 1:
        return [f"'num_machines' is {pipe.num_machines}; it must be at least 1"]
    if pipe.machine_rank < 0:
        problems.append(f"'machine_rank' is {pipe.machine_rank}; it must be at least 0")
    if pipe.num_machines > 1:
        if not pipe.main_process_ip:
            problems.append(f"'num_machines: {pipe.num_machines}' needs 'main_process_ip': the address of the main "
                            "machine (machine_rank 0) that the others reach")
        if pipe.machine_rank >= pipe.num_machines:
            problems.append(f"'machine_rank: {pipe.machine_rank}' is not below 'num_machines: {pipe.num_machines}'; "
                            f"the ranks are 0 (the main machine) to {pipe.num_machines - 1}")
        if pipe.main_process_port is not None and not 1 <= pipe.main_process_port <= 65535:
            problems.append(f"'main_process_port: {pipe.main_process_port}' is not a port every machine can meet on; "
                            "give one between 1 and 65535 (default 29500)")
    file_machines = _accelerate_file_machines(pipe.accelerate_config)
    if file_machines > 1 and pipe.num_machines == 1 and config.ray is None:  # on Ray its workers are the machines
        problems.append(f"'accelerate_config' ({pipe.accelerate_config}) names num_machines: {file_machines}; set "
                        "'num_machines', 'main_process_ip' (and 'main_process_port') in the tuneline config instead, "
                        "so that every machine's launch gets its own rank from `tuneline train-node --machine-rank N`")
    return problems


def _accelerate_file_machines(path: str | None) -> int:
    """num_machines of an accelerate config file; 1 when there is none or it cannot be read (preflight says so)."""
    try:
        return int(read_accelerate_file(path).get("num_machines") or 1)
    except (TypeError, ValueError):
        return 1


def _check_keys(config: RunConfig) -> list[str]:
    ft, tr, data = config.finetuning, config.training, config.data
    problems = []
    if not config.model.model_name_or_path:
        problems.append("'model_name_or_path' is required: a local model folder or a hub id")
    if tr.get("fp16") and tr.get("bf16"):
        problems.append("'fp16' and 'bf16' are both true; choose one")
    reward_config = config.pipeline.reward_model_config
    if ft.stage == "ppo" and not ft.reward_model and not reward_config:
        problems.append("'stage: ppo' needs 'reward_model' (a reward model path or adapter trained with stage: rm) "
                        "or 'reward_model_config' (a stage: rm config the flow trains first)")
    if ft.stage == "ppo":
        sharded = [f"'{key}: {value}'" for key, value in (("deepspeed", tr.get("deepspeed")),
                                                           ("accelerate_config", config.pipeline.accelerate_config))
                   if value]
        if sharded:
            problems.append(f"'stage: ppo' runs data parallel (several GPUs, or 'num_processes'), without DeepSpeed "
                            f"or FSDP; remove {', '.join(sharded)} (dpo and kto do use them)")
    if ft.reward_model and reward_config:
        problems.append("'reward_model' and 'reward_model_config' are both set; the flow trains the reward model "
                        "from 'reward_model_config' and uses its output_dir: remove one")
    if ft.pref_loss in ("orpo", "simpo") and ft.ref_model and ft.stage == "dpo":
        problems.append(f"'pref_loss: {ft.pref_loss}' uses no reference model; remove 'ref_model'")
    if not config.predict_only:  # a run that trains nothing: scope_problems names each training key it sets, once
        if ft.use_badam and ft.finetuning_type != "full":
            problems.append(f"'use_badam' trains full parameters; it conflicts with 'finetuning_type: "
                            f"{ft.finetuning_type}'")
        problems += _adapter_method_problems(config) + ppo_problems(config) + grpo_problems(config)
        problems += badam_problems(config) + optimizer_problems(config) + feature_problems(config)
    problems += scope_problems(config)
    if not 0 <= ft.dpo_label_smoothing < 0.5:
        problems.append(f"'dpo_label_smoothing' is {ft.dpo_label_smoothing}; allowed: 0 <= value < 0.5")
    if ft.ppo_target <= 0 or ft.ppo_init_kl_coef < 0:
        problems.append(f"'ppo_target' is {ft.ppo_target} and 'ppo_init_kl_coef' {ft.ppo_init_kl_coef}; the KL "
                        "target must be above 0 and the starting coefficient at least 0")
    if ft.lora_rank < 1:
        problems.append(f"'lora_rank' is {ft.lora_rank}; it must be at least 1")
    if data.cutoff_len < 2:
        problems.append(f"'cutoff_len' is {data.cutoff_len}; it must be at least 2")
    if data.val_size < 0 or (data.val_size > 1 and not float(data.val_size).is_integer()):
        problems.append(f"'val_size' is {data.val_size}; use a fraction in (0, 1) or a whole row count")
    if tr.get("do_train", True) and not data.dataset and ft.stage not in ("ppo", "grpo", "rloo"):
        problems.append("'dataset' is required for training: name one or more entries of dataset_info.json")
    problems += _accepted_but_not_built(config) + hub_repo_problems(config) + safety_problems(config)
    for key in ("load_best_model_at_end", "early_stopping_steps"):
        if (tr.get(key) or getattr(ft, key, None)) and not config.has_validation:
            problems.append(f"'{key}' needs an evaluation split: set 'val_size' or 'eval_dataset'")
    strategy = tr.get("eval_strategy") or tr.get("evaluation_strategy") or "no"
    if strategy != "no" and not config.has_validation:
        problems.append(f"'eval_strategy: {strategy}' evaluates during training on a validation split, and there is "
                        "none: set 'val_size' or 'eval_dataset', or 'eval_strategy: no'")
    if ft.early_stopping_steps and strategy == "no":
        problems.append(f"'early_stopping_steps: {ft.early_stopping_steps}' counts evaluations, but none run: set "
                        "'eval_strategy: steps' (with 'eval_steps') or 'eval_strategy: epoch'")
    return problems


def _adapter_method_problems(config: RunConfig) -> list[str]:
    """PiSSA and LoRA+ where they would be ignored, or (PiSSA) where the reference model would be wrong."""
    ft, problems = config.finetuning, []
    if ft.loraplus_lr_ratio is not None and ft.finetuning_type != "lora":
        problems.append(f"'loraplus_lr_ratio' sets the learning rate of LoRA's B matrices; with 'finetuning_type: "
                        f"{ft.finetuning_type}' there are none: remove it, or use 'finetuning_type: lora'")
    if ft.finetuning_type == "oft" and (ft.oft_rank == 0) == (ft.oft_block_size == 0):
        problems.append(f"'oft_rank: {ft.oft_rank}' and 'oft_block_size: {ft.oft_block_size}' are both "
                        f"{'set' if ft.oft_rank else 'zero'}; OFT takes one of them and derives the other: set the "
                        "other to 0")
    if not 0 <= ft.module_dropout < 1:
        problems.append(f"'module_dropout' is {ft.module_dropout}; it must be at least 0 and below 1")
    if ft.pissa_convert and not ft.pissa_init:
        problems.append("'pissa_convert' converts a PiSSA adapter to plain LoRA; without 'pissa_init: true' the "
                        "adapter is plain LoRA already: remove it, or set 'pissa_init: true'")
    if not ft.pissa_init:
        return problems
    if ft.finetuning_type != "lora":
        problems.append("'pissa_init' needs 'finetuning_type: lora'")
    reference_free = ft.stage == "dpo" and ft.pref_loss in ("orpo", "simpo")
    if ft.stage in ("dpo", "kto", "ppo") and not reference_free and not ft.ref_model:
        problems.append(f"'pissa_init' with 'stage: {ft.stage}' and no 'ref_model': the reference would be the policy "
                        "with its adapter switched off, which PiSSA leaves without the weights it moved into the "
                        "adapter; set 'ref_model' (e.g. to the base model), or remove 'pissa_init'")
    if config.model.adapter_name_or_path and (not ft.create_new_adapter or config.model.quantization_bit):
        problems.append("'pissa_init' initialises a new adapter, but the last adapter of 'adapter_name_or_path' keeps "
                        "training: set 'create_new_adapter: true' (unquantized base), or remove 'pissa_init'")
    return problems


def badam_problems(config: RunConfig, world_size: int | None = None) -> list[str]:
    """What BAdam cannot serve in `world_size` processes: this launch's (WORLD_SIZE) when training, else the planned
    ones ('num_processes'; preflight passes the GPUs the launcher will use). The optimizer checks its launch again."""
    if not config.finetuning.use_badam:
        return []
    world_size = world_size or int(os.environ.get("WORLD_SIZE", "0")) or config.pipeline.num_processes or 1
    return block_optimizer_problems(config.finetuning, world_size, zero_stage(config.training.get("deepspeed")))


def block_optimizer_problems(ft, world_size: int, stage: int) -> list[str]:
    """badam's block optimizer runs in one process, or across processes under DeepSpeed ZeRO-3 in layer mode."""
    if ft.badam_mode == "ratio" and (world_size > 1 or stage):
        return [f"'badam_mode: ratio' runs in one process without DeepSpeed (got {world_size} process(es)"
                f"{f', ZeRO-{stage}' if stage else ''}); use 'badam_mode: layer' with DeepSpeed ZeRO-3 for several "
                "processes, or train in one process ('num_processes: 1')"]
    if ft.badam_mode == "layer" and (world_size > 1 or stage) and stage != 3:
        return [f"'badam_mode: layer' on {world_size} process(es) needs DeepSpeed ZeRO-3 (got "
                f"{f'ZeRO-{stage}' if stage else 'no DeepSpeed'}); use a ZeRO-3 'deepspeed' config or train in one "
                "process ('num_processes: 1')"]
    return []


def hub_repo_id(config: RunConfig) -> str:
    """The repo `push_to_hub` uploads to: 'hub_model_id', else output_dir's name as transformers names it (a name
    without a namespace goes under the token's user)."""
    return str(config.training.get("hub_model_id") or Path(config.training.get("output_dir") or ".").absolute().name)


def hub_repo_problems(config: RunConfig) -> list[str]:
    """A repo id the hub would refuse, found before training rather than after it (huggingface_hub's own check)."""
    if not config.training.get("push_to_hub"):
        return []
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    repo_id = hub_repo_id(config)
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        where = (f"'hub_model_id: {repo_id}'" if config.training.get("hub_model_id") else
                 f"output_dir's name '{repo_id}' (the repo 'push_to_hub: true' uploads to without 'hub_model_id')")
        return [f"{where} is not a Hugging Face repo id: {exc} Set 'hub_model_id' to 'name' or 'namespace/name' "
                "(letters, digits, '-', '_', '.')"]
    return []


REPORTS_TO = ("none", "mlflow")  # tuneline records every run in MLflow itself


def _accepted_but_not_built(config: RunConfig) -> list[str]:
    """LLaMA-Factory keys with a value that would change what runs, where tuneline does not do that: refused,
    never ignored."""
    data, ft, problems = config.data, config.finetuning, []
    if data.streaming:
        problems.append("'streaming: true' is not supported: tuneline tokenizes and caches the whole dataset, keyed by "
                        "its content; remove it (use 'max_samples' to train on part of a dataset)")
    if data.buffer_size != DataArgs.buffer_size and not data.streaming:
        problems.append(f"'buffer_size: {data.buffer_size}' only applies to 'streaming', which tuneline does not do; "
                        "remove it")
    if config.model.export_device != "cpu":
        problems.append(f"'export_device: {config.model.export_device}': `tuneline export` merges on the CPU in float32, "
                        "so that the merged weights are exact; remove it")
    if ft.dpo_label_smoothing and ft.pref_loss != "sigmoid":
        problems.append(f"'dpo_label_smoothing: {ft.dpo_label_smoothing}' smooths the sigmoid loss (cDPO) only; with "
                        f"'pref_loss: {ft.pref_loss}' remove it, or use 'pref_loss: sigmoid'")
    reports = config.training.get("report_to")
    names = [reports] if isinstance(reports, str) else list(reports or [])
    if any(name not in REPORTS_TO for name in names):
        problems.append(f"'report_to: {reports}': tuneline records the run in MLflow (and Prefect) itself and reports "
                        f"nowhere else; remove it, or use one of {', '.join(REPORTS_TO)}")
    return problems


def check_model_paths(config: RunConfig) -> list[str]:
    """Every model or adapter path the run will load, so a typo fails before any step runs."""
    ft = config.finetuning
    keys = {"model_name_or_path": config.model.model_name_or_path, "ref_model": ft.ref_model,
            "reward_model": ft.reward_model}
    problems = [p for key, value in keys.items() for p in check_model_path(value, key)]
    for key, value in (("adapter_name_or_path", config.model.adapter_name_or_path),
                       ("reward_model_adapters", ft.reward_model_adapters)):
        for path in (value or "").split(","):
            problems += check_model_path(path.strip(), key)
    return problems


def check_reward_model_config(config: RunConfig) -> list[str]:
    """`reward_model_config` must name a YAML file of a `stage: rm` run."""
    path = config.pipeline.reward_model_config
    if not path:
        return []
    if not Path(path).is_file():
        return [f"'reward_model_config' file '{path}' does not exist; name the YAML config of a stage: rm run"]
    try:
        stage = (yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}).get("stage")
    except (yaml.YAMLError, AttributeError):
        return [f"'reward_model_config' '{path}' is not a YAML mapping of config keys"]
    if stage != "rm":
        return [f"'reward_model_config' '{path}' has 'stage: {stage}'; it must be a 'stage: rm' config"]
    return []


def check_model_path(value: str | None, key: str) -> list[str]:
    """A local path must exist; something shaped like `org/name` is taken as a hub id."""
    if not value or Path(value).expanduser().exists():
        return []
    if HUB_ID.match(value) and not value.startswith((".", "/", "~")):
        return []
    return [f"'{key}' path '{value}' does not exist (nor is it a hub id like 'org/name')"]


def check_datasets(config: RunConfig) -> list[str]:
    names = config.dataset_names + config.eval_dataset_names
    if not names:
        return []
    info_path = Path(config.data.dataset_dir) / "dataset_info.json"
    if not info_path.is_file():
        return [f"'dataset_dir' has no dataset_info.json: '{info_path}' does not exist"]
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        return [f"'{info_path}' is not valid JSON: {exc}"]
    problems = []
    for name in names:
        if name not in info:
            problems.append(f"dataset '{name}' is not in {info_path}{did_you_mean(name, info)}")
            continue
        file_name = info[name].get("file_name")
        if file_name and not (Path(config.data.dataset_dir) / file_name).exists():
            problems.append(f"dataset '{name}': file '{Path(config.data.dataset_dir) / file_name}' does not exist")
    return problems
