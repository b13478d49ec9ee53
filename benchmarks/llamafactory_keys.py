"""How tuneline answers every key a LLaMA-Factory 0.9.5 YAML can hold: honoured, refused by name with what to do,
or unknown. The keys are LLaMA-Factory's own (tests/fixtures/llamafactory_keys/keys.json, generated from its
argument dataclasses) plus the TrainingArguments keys of the installed transformers.

    PYTHONPATH=. python benchmarks/llamafactory_keys.py [--list]
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path

from tuneline.config import load_config
from tuneline.errors import ConfigError

KEYS_FILE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "llamafactory_keys" / "keys.json"


def all_keys() -> dict[str, object]:
    """Every key with its LLaMA-Factory default (transformers' keys: theirs)."""
    from transformers import Seq2SeqTrainingArguments

    keys = {f.name: getattr(f.default, "value", f.default) for f in dataclasses.fields(Seq2SeqTrainingArguments)
            if f.init}
    keys.update({k["key"]: k["default"] for k in json.loads(KEYS_FILE.read_text())["keys"]})
    return keys


BASE = {"model_name_or_path": "org/model", "dataset": "demo_sft", "output_dir": "/tmp/out"}


def other_than(value: object) -> object:
    """A value other than `value`, of its kind (for None: 1)."""
    if isinstance(value, bool) or value is None:
        return {True: False, False: True, None: 1}[value]
    return value * 2 + 1 if isinstance(value, (int, float)) else f"{value}x"


def answer(key: str, value: object) -> str:
    """'unknown', 'refused' (at a value other than its default, the key named) or 'honoured'."""
    try:
        load_config(None, {**BASE, key: other_than(value)}, check_paths=False)
    except ConfigError as exc:
        text = str(exc)
        if f"unknown key '{key}'" in text:
            return "unknown"
        if f"'{key}" in text and "LLaMA-Factory" in text or f"'{key}'" in text and "Ray" in text:
            return "refused"
    return "honoured"


def main() -> None:
    answers = {key: answer(key, value) for key, value in sorted(all_keys().items())}
    print(dict(Counter(answers.values())), "of", len(answers), "keys")
    if "--list" in sys.argv:
        for key, what in answers.items():
            print(f"{what:9} {key}")


if __name__ == "__main__":
    main()
