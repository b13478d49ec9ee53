"""A template's stop words must each be one token of the model's tokenizer, checked before a run starts.

LLaMA-Factory adds the missing ones to the tokenizer and grows the embeddings as it loads the model; tuneline uses
the tokenizer as the model's files hold it (every step loads it from the same files), so a missing stop word would
be trained on as the characters that spell it and generation would not stop on it. The check reads the tokenizer's
own files, without loading transformers."""

from __future__ import annotations

import json
from pathlib import Path

from tuneline.config.run_config import split_names


def tokenizer_vocabulary(folder: Path) -> set[str] | None:
    """Every token of the tokenizer saved in `folder` (its vocabulary and added tokens); None when its files are not
    ones read here (a sentencepiece model alone, or no tokenizer at all)."""
    tokens: set[str] = set()
    whole = folder / "tokenizer.json"
    if whole.is_file():
        data = json.loads(whole.read_text(encoding="utf-8"))
        vocab = data.get("model", {}).get("vocab", {})
        tokens |= set(vocab) if isinstance(vocab, dict) else {entry[0] for entry in vocab}
        tokens |= {added["content"] for added in data.get("added_tokens", [])}
    elif (folder / "vocab.json").is_file():
        tokens |= set(json.loads((folder / "vocab.json").read_text(encoding="utf-8")))
    else:
        return None
    for extra in ("added_tokens.json",):
        if (folder / extra).is_file():
            tokens |= set(json.loads((folder / extra).read_text(encoding="utf-8")))
    return tokens


def missing_stop_words(template, model_args) -> list[str]:
    """The template's stop words that are not single tokens of the model's tokenizer, `add_special_tokens` counted;
    [] when the tokenizer's files cannot be read here (a hub id, a sentencepiece model alone)."""
    folder = Path(str(model_args.model_name_or_path)).expanduser()
    vocabulary = tokenizer_vocabulary(folder) if folder.is_dir() else None
    if vocabulary is None:
        return []
    added = set(split_names(model_args.add_special_tokens))
    return [word for word in template.stop_words if word not in vocabulary and word not in added]


def stop_word_problem(template, model_args) -> str | None:
    """Why this template cannot run on this tokenizer, with the two ways out; None when it can."""
    missing = missing_stop_words(template, model_args)
    if not missing:
        return None
    words = ",".join(missing)
    return (f"'template: {template.name}' stops on {', '.join(repr(w) for w in missing)}, which "
            f"{'is not a token' if len(missing) == 1 else 'are not tokens'} of the tokenizer in "
            f"'{model_args.model_name_or_path}' (it would be trained on as the characters that spell "
            f"{'it' if len(missing) == 1 else 'them'}); add {'it' if len(missing) == 1 else 'them'} with "
            f"'add_special_tokens: {words}' (new tokens: the embeddings grow, as LLaMA-Factory does), or use the "
            "template the model was trained with ('template: auto' reads the tokenizer's own)")
