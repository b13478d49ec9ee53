"""The data tests' fixtures, shared by the tiers that hold such tests."""

from tests.support.data_fixtures import char_tokenizer, char_tokenizer_dir, make_config, media_data_dir  # noqa: F401
