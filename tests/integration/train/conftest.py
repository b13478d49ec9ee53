"""The trainer tests' fixtures, shared by the tiers that hold such tests."""

from tests.support.ppo import reward_model_dir  # noqa: F401
from tests.support.train_fixtures import sft_dataset_dir, tokenizer  # noqa: F401
