"""The static table of TrainingArguments keys must match the installed transformers.

If this fails after a transformers upgrade, regenerate tuneline/config/training_keys.py's TRAINING_KEYS
from `dataclasses.fields(transformers.Seq2SeqTrainingArguments)`.
"""

import dataclasses

from transformers import Seq2SeqTrainingArguments

from tuneline.config.training_keys import LEGACY_TRAINING_KEYS, TRAINING_KEYS


def test_table_matches_installed_transformers():
    installed = {f.name for f in dataclasses.fields(Seq2SeqTrainingArguments) if f.init}
    ours = set(TRAINING_KEYS) - set(LEGACY_TRAINING_KEYS)
    assert ours == installed, f"missing: {installed - ours}; stale: {ours - installed}"
    assert not set(LEGACY_TRAINING_KEYS) & installed, "a legacy key is a real key again: drop its translation"
