"""Model side: tokenizer and model loading, adapters and finetuning types."""

from tuneline.model.tokenizer import load_tokenizer, tokenizer_fingerprint

__all__ = ["load_tokenizer", "tokenizer_fingerprint"]
