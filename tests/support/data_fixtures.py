"""Fixtures for the data tests: a character-level tokenizer (ids written by hand), dataset folders, configs.

The char tokenizer maps every character to its code point (so expected ids are `[ord(c) for c in text]`)
and has <pad>=0, <s>=1, </s>=2 as special tokens: expected ids and label masks can be spelled out exactly,
independent of any trained vocabulary.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.data import BOS, EOS, PAD


@pytest.fixture(scope="session")
def char_tokenizer_dir(tmp_path_factory) -> Path:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "<s>": BOS, "</s>": EOS, "<unk>": 3}
    vocab.update({chr(i): i for i in [9, 10, *range(32, 127)]})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>")
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    out = tmp_path_factory.mktemp("char") / "tok"
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def char_tokenizer(char_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(char_tokenizer_dir)


@pytest.fixture
def media_data_dir(tmp_path) -> Path:
    """A copy of LLaMA-Factory's multimodal demo folder (tests/fixtures/llamafactory-mm) as tmp_path/data, the
    `dataset_dir` of make_config: a test may cut, replace or remove its media files."""
    root = tmp_path / "data"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "llamafactory-mm", root)
    return root


@pytest.fixture
def make_config(tmp_path, char_tokenizer_dir):
    """RunConfig over tmp_path/data with the char tokenizer (override model_name_or_path for the tiny model)."""
    from tuneline.config import load_config

    def make(**overrides):
        values = {
            "model_name_or_path": str(char_tokenizer_dir), "dataset_dir": str(tmp_path / "data"),
            "pipeline_cache_dir": str(tmp_path / "cache"), "output_dir": str(tmp_path / "out"),
            "template": "empty", "cutoff_len": 1024, "stage": "sft",
        }
        values.update(overrides)
        return load_config(overrides=values, check_paths=False)

    return make
