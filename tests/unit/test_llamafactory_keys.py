"""Every key a LLaMA-Factory 0.9.5 YAML can hold (its argument dataclasses, listed in
tests/fixtures/llamafactory_keys/keys.json by the generate.py beside it) and every TrainingArguments key of the
installed transformers: honoured, or refused as a LLaMA-Factory option with what to do instead; never "unknown key".
The refused ones set together come in one message, beside the config's other problems."""

from __future__ import annotations

import json

import pytest

from benchmarks.llamafactory_keys import BASE, KEYS_FILE, all_keys, answer, other_than
from tuneline.config import load_config
from tuneline.config.llamafactory_keys import REFUSED
from tuneline.errors import ConfigError

KEYS = all_keys()


def test_the_fixture_holds_llamafactory_0_9_5s_keys():
    fixture = json.loads(KEYS_FILE.read_text())
    assert fixture["llamafactory"] == "0.9.5" and len(fixture["keys"]) == 241
    named = {k["key"] for k in fixture["keys"]}
    assert {"enable_liger_kernel", "fp8_backend", "profiler_repeat", "use_eaft_loss", "asft_alpha", "add_tokens",
            "new_special_tokens_config", "model_max_length", "use_kv_cache", "vllm_gpu_util", "ray_num_workers",
            "template", "lora_rank"} <= named


def test_no_key_of_llamafactory_or_transformers_is_unknown():
    answers = {key: answer(key, value) for key, value in KEYS.items()}
    assert [key for key, what in answers.items() if what == "unknown"] == []  # the Ray and vLLM ones included
    assert {key for key, what in answers.items() if what == "refused"} >= set(REFUSED)


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_a_refused_key_is_named_as_a_llamafactory_option_with_what_to_do(key):
    value = other_than(REFUSED[key][0])
    with pytest.raises(ConfigError) as caught:
        load_config(None, {**BASE, key: value}, check_paths=False)
    assert caught.value.problems == [f"'{key}: {value}' is a LLaMA-Factory option tuneline does not support "
                                     f"({REFUSED[key][1]}); remove it"]
    load_config(None, {**BASE, key: REFUSED[key][0]}, check_paths=False)  # its off value changes nothing: accepted


def test_refused_keys_come_in_one_message_beside_the_other_problems():
    refused = {key: other_than(off) for key, (off, _) in REFUSED.items()}
    with pytest.raises(ConfigError) as caught:
        load_config(None, {**BASE, **refused, "use_unsloth": True, "cutoff_len": 1}, check_paths=False)
    [message] = [p for p in caught.value.problems if "LLaMA-Factory options" in p]
    assert message.startswith(f"{len(refused) + 1} LLaMA-Factory options tuneline does not support are set")
    assert all(f"'{key}: {value}' ({REFUSED[key][1]})" in message for key, value in refused.items())
    assert "'use_unsloth: True' (only its default, False, is accepted)" in message
    assert "'cutoff_len' is 1; it must be at least 2" in caught.value.problems
