"""The model tests' fixtures, shared by the tiers that hold such tests."""

from tests.support.model_fixtures import batch, make_config, tokenizer  # noqa: F401
