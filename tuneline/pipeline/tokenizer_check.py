"""The load-tokenizer step's library side: load the tokenizer once, to prove it works, and describe it."""

from __future__ import annotations

from tuneline.config import RunConfig
from tuneline.content.records import TokenizerInfo
from tuneline.identity.config_keys import tokenizer_key


def inspect_tokenizer(config: RunConfig) -> TokenizerInfo:
    """Later steps receive this reference, not the tokenizer object."""
    from tuneline.model import load_tokenizer

    tokenizer = load_tokenizer(config.model)
    return TokenizerInfo(path=str(config.model.model_name_or_path), fingerprint=tokenizer_key(config),
                         vocab_size=len(tokenizer), has_chat_template=bool(getattr(tokenizer, "chat_template", None)),
                         eos_token=tokenizer.eos_token, pad_token=tokenizer.pad_token)
