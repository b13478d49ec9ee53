"""Tokenizer loading and its content fingerprint (what the tokenized-dataset cache is keyed by)."""

from __future__ import annotations

from pathlib import Path

from tuneline.config.args import ModelArgs
from tuneline.content.fingerprint import FileHasher, fingerprint
from tuneline.hub.revision import model_commit
from tuneline.model.new_tokens import add_new_tokens, special_tokens

# Files that decide how text and images become ids; weights are deliberately not among them.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
    "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json",
)


def load_tokenizer(model_args: ModelArgs):
    """AutoTokenizer from a local folder or hub id; remote code only when the config allows it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path,
        cache_dir=model_args.cache_dir,
        revision=model_args.model_revision,
        token=model_args.hf_hub_token,
        trust_remote_code=model_args.trust_remote_code,
        use_fast=model_args.use_fast_tokenizer,
        split_special_tokens=model_args.split_special_tokens,
        padding_side="right",
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    add_new_tokens(tokenizer, model_args)  # load_model grows the embeddings to match
    return tokenizer


def tokenizer_fingerprint(model_args: ModelArgs, memo_dir: str | Path | None = None) -> str:
    """Hash of the tokenizer's own files for a local model; name and resolved commit for a hub id (a moved `main`
    may hold another tokenizer)."""
    root = Path(str(model_args.model_name_or_path)).expanduser()
    if not root.is_dir():
        name = str(model_args.model_name_or_path)
        return fingerprint("hub", name, model_commit(model_args, name, "model_name_or_path", model_args.model_revision))
    hasher = FileHasher(memo_dir)
    files = {name: hasher.hash_file(root / name) for name in TOKENIZER_FILES if (root / name).is_file()}
    hasher.save()
    added = [value for value in (model_args.add_special_tokens, model_args.add_tokens) if value]
    special = special_tokens(model_args) if model_args.new_special_tokens_config else []
    return fingerprint("tokenizer", files, model_args.split_special_tokens, model_args.use_fast_tokenizer, *added,
                       *([special] if special else []))
