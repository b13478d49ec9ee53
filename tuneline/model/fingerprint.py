"""The model's content fingerprint: what `train` and `evaluate` cache keys say about the model. No torch here.

A hub id stands for the commit its revision resolves to, so a moved `main` is a new model. Only top-level files
count: a trained output_dir's checkpoints and logs do not change the model it holds."""

from __future__ import annotations

from pathlib import Path

from tuneline.config import RunConfig
from tuneline.config.args import ModelArgs
from tuneline.config.feature_keys import token_descriptions
from tuneline.config.run_config import split_names
from tuneline.content.fingerprint import FileHasher, fingerprint
from tuneline.hub.revision import model_commit

WEIGHT_PATTERNS = ("config.json", "*.safetensors", "model.safetensors.index.json", "*.bin", "*.bin.index.json")
REMOTE_CODE_PATTERNS = ("*.py",)
NOT_WEIGHTS = frozenset({"training_args.bin", "optimizer.bin", "scheduler.bin"})
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")

# Keys that change which weights load, whatever the finetuning.
LOAD_KEYS = ("model_revision", "quantization_bit", "quantization_type", "double_quantization", "resize_vocab",
             "add_special_tokens", "add_tokens", "new_special_tokens_config", "init_special_tokens",
             "trust_remote_code")
# Keys that change what the finetuning starts from and which parameters train.
FINETUNING_KEYS = (
    "finetuning_type", "lora_rank", "lora_alpha", "lora_dropout", "lora_target", "additional_target", "use_rslora",
    "use_dora", "create_new_adapter", "pissa_init", "pissa_iter", "pissa_convert", "freeze_trainable_layers",
    "freeze_trainable_modules", "freeze_extra_modules", "use_badam", "badam_mode", "badam_start_block",
    "badam_switch_mode", "badam_switch_interval", "badam_update_ratio", "badam_mask_mode", "oft_rank",
    "oft_block_size", "oft_target", "module_dropout", "pure_bf16",
)


def _local_files(root: Path, patterns: tuple[str, ...]) -> list[Path]:
    return sorted({p for pattern in patterns for p in root.glob(pattern)
                   if p.is_file() and p.name not in NOT_WEIGHTS})


def _source_hash(path: str, patterns: tuple[str, ...], hasher: FileHasher, key: str, margs: ModelArgs,
                 revision: str | None = None) -> object:
    """A local folder's files by content; a hub id at its resolved commit (`key` names where it came from)."""
    root = Path(path).expanduser()
    if not root.is_dir():
        return ["hub", path, model_commit(margs, path, key, revision)]
    return {p.name: hasher.hash_file(p) for p in _local_files(root, patterns)}


def model_fingerprint(config: RunConfig, memo_dir: str | Path | None = None, *, adapters: str | None = None,
                      include_finetuning: bool = True) -> str:
    """sha256 over base weights, adapter files and the load (and, by default, finetuning) keys.
    `include_finetuning=False` keys the model as evaluation loads it, so runs on one base share its evaluation."""
    margs = config.model
    hasher = FileHasher(memo_dir)
    patterns = WEIGHT_PATTERNS + (REMOTE_CODE_PATTERNS if margs.trust_remote_code else ())
    base = _source_hash(str(margs.model_name_or_path), patterns, hasher, "model_name_or_path", margs,
                        margs.model_revision)
    adapter_list = split_names(margs.adapter_name_or_path if adapters is None else adapters)
    adapter_hashes = [_source_hash(a, ADAPTER_FILES, hasher, "adapter_name_or_path", margs) for a in adapter_list]
    hasher.save()
    keys = LOAD_KEYS + (FINETUNING_KEYS if include_finetuning else ())
    descriptions = token_descriptions(margs.new_special_tokens_config)  # edited in place: new starting rows
    return fingerprint("model", base, adapter_hashes, config.slice(*keys), *([descriptions] if descriptions else []))


def reward_model_fingerprint(config: RunConfig, memo_dir: str | Path | None = None) -> str | None:
    """ppo's reward model and its adapters by content (a retrained reward model in the same folder changes it),
    grpo's reward functions; None for every other stage."""
    ft = config.finetuning
    if config.stage in ("grpo", "rloo"):
        return grpo_rewards_fingerprint(config, memo_dir)
    if config.stage != "ppo":
        return None
    hasher = FileHasher(memo_dir)
    sources = [(key, name) for key, names in (("reward_model", [ft.reward_model]),
                                              ("reward_model_adapters", split_names(ft.reward_model_adapters)))
               for name in names if name]
    parts = [_source_hash(name, WEIGHT_PATTERNS + ADAPTER_FILES, hasher, key, config.model) for key, name in sources]
    hasher.save()
    return fingerprint("reward-model", parts, ft.reward_model_type)


def grpo_rewards_fingerprint(config: RunConfig, memo_dir: str | Path | None = None) -> str:
    """grpo's `reward_funcs` by content: a user's reward file by its bytes, a reward model folder by its weights, a
    built-in by its name (trl's version is pinned)."""
    from tuneline.config.grpo_keys import reward_function_path

    hasher = FileHasher(memo_dir)
    parts = []
    for item in config.grpo.reward_funcs or []:
        located = reward_function_path(str(item))
        if located and Path(located[0]).is_file():
            parts.append([item, hasher.hash_file(Path(located[0]))])
        elif Path(str(item)).is_dir():
            parts.append([item, _source_hash(str(item), WEIGHT_PATTERNS + ADAPTER_FILES, hasher, "reward_funcs",
                                             config.model)])
        else:
            parts.append(item)
    hasher.save()
    return fingerprint("grpo-rewards", parts, config.grpo.reward_weights)
