"""The bundled demo datasets, generated deterministically: `python -m tuneline.demo.demo_data [OUT_DIR]`.

Tasks are short and regular so a tiny model learns them on a CPU in minutes and exact match on the held-out split
can move; each task splits its pool of distinct inputs once, so eval rows never appear in training."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

DEFAULT_SEED = 0
SYSTEM_PROMPT = "You are a careful assistant. Answer with the result only."
_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
         "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Task:
    """One demo task: its instruction, every distinct input, the right answer and a plausible wrong one."""

    name: str
    instruction: str
    inputs: tuple[str, ...]
    answer: Callable[[str], str]
    wrong: Callable[[str], str]


def _words(n: int) -> str:
    if n < 20:
        return _ONES[n]
    return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])


def _off_by_one(text: str) -> str:
    n = int(text)
    return str(n + 1 if n % 2 == 0 else n - 1)


def _sum(text: str) -> int:
    a, b = text.split(" + ")
    return int(a) + int(b)


def _pair(text: str) -> tuple[int, int]:
    a, b = text.split(" and ")
    return int(a), int(b)


def _upper_wrong(text: str) -> str:
    letters = text.upper().split()
    return " ".join([letters[0].lower(), *letters[1:]])


def _reverse_wrong(text: str) -> str:
    letters = text.split()
    return " ".join(letters[1:] + letters[:1])


def _spaced_triples() -> tuple[str, ...]:
    return tuple(" ".join(t) for t in product(_LETTERS, repeat=3) if len(set(t)) == 3)


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task("parity", "Is the number even or odd?", tuple(str(n) for n in range(1000)),
             lambda x: "even" if int(x) % 2 == 0 else "odd", lambda x: "odd" if int(x) % 2 == 0 else "even"),
        Task("larger", "Which number is larger?",
             tuple(f"{a} and {b}" for a in range(10, 100) for b in range(10, 100) if a != b),
             lambda x: str(max(_pair(x))), lambda x: str(min(_pair(x)))),
        Task("add", "Add the two numbers.", tuple(f"{a} + {b}" for a in range(10) for b in range(10)),
             lambda x: str(_sum(x)), lambda x: _off_by_one(str(_sum(x)))),
        Task("words", "Write the number in words.", tuple(str(n) for n in range(100)),
             lambda x: _words(int(x)), lambda x: _words(int(_off_by_one(x)))),
        Task("upper", "Uppercase the letters.", _spaced_triples(), lambda x: x.upper(), _upper_wrong),
        Task("reverse", "Reverse the letters.", _spaced_triples(), lambda x: " ".join(reversed(x.split())),
             _reverse_wrong),
    )
}


# Inputs reserved per task for held-out splits; every training set draws only from the rest.
EVAL_RESERVE = {"parity": 60, "larger": 60, "add": 20, "words": 20, "upper": 60, "reverse": 60}


def split_pools(seed: int = DEFAULT_SEED) -> dict[str, tuple[list[str], list[str]]]:
    """Per task, disjoint (eval, train) input pools: what keeps every eval file out of every train file."""
    pools = {}
    for name, task in TASKS.items():
        inputs = list(task.inputs)
        random.Random(f"{seed}:{name}").shuffle(inputs)
        pools[name] = (inputs[:EVAL_RESERVE[name]], inputs[EVAL_RESERVE[name]:])
    return pools


def _sample(pools: dict, split: int, counts: dict[str, int], rng: random.Random) -> list[tuple[str, str]]:
    """Distinct (task, input) pairs drawn from one side of the pools (0 eval, 1 train), shuffled."""
    pairs = []
    for name, n in counts.items():
        pool = pools[name][split]
        pairs += [(name, x) for x in rng.sample(pool, min(n, len(pool)))]
    rng.shuffle(pairs)
    return pairs


def _prompt(name: str, text: str) -> str:
    return f"{TASKS[name].instruction}\n{text}"


def _alpaca_sft(pairs: list, rng: random.Random, extras: bool) -> list[dict[str, Any]]:
    """Alpaca rows; with `extras` about 15% carry a system prompt and 10% a one-turn history."""
    rows = []
    for name, text in pairs:
        row = {"instruction": TASKS[name].instruction, "input": text, "output": TASKS[name].answer(text),
               "system": "", "history": []}
        if extras and rng.random() < 0.15:
            row["system"] = SYSTEM_PROMPT
        if extras and rng.random() < 0.10:
            other, other_text = pairs[rng.randrange(len(pairs))]
            row["history"] = [[_prompt(other, other_text), TASKS[other].answer(other_text)]]
        rows.append(row)
    return rows


def _alpaca_pref(pairs: list) -> list[dict[str, Any]]:
    return [{"instruction": TASKS[n].instruction, "input": x, "chosen": TASKS[n].answer(x),
             "rejected": TASKS[n].wrong(x)} for n, x in pairs]


def _alpaca_kto(pairs: list, rng: random.Random) -> list[dict[str, Any]]:
    rows = []
    for name, text in pairs:
        good = rng.random() < 0.5
        answer = TASKS[name].answer(text) if good else TASKS[name].wrong(text)
        rows.append({"instruction": TASKS[name].instruction, "input": text, "output": answer, "kto_tag": good})
    return rows


_TOOLS = [
    {"name": "add", "description": "Add two integers.",
     "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"]}},
]


def _human(value: str) -> dict[str, str]:
    return {"from": "human", "value": value}


def _gpt(value: str) -> dict[str, str]:
    return {"from": "gpt", "value": value}


def _tool_conversation(text: str) -> list[dict[str, str]]:
    """Ask for a sum, call the `add` tool, read its observation, answer."""
    a, b = (int(v) for v in text.split(" + "))
    call = json.dumps({"name": "add", "arguments": {"a": a, "b": b}})
    return [_human(f"Use the tool to add {a} and {b}."), {"from": "function_call", "value": call},
            {"from": "observation", "value": json.dumps({"result": a + b})}, _gpt(str(a + b))]


def _sharegpt_sft(pairs: list, rng: random.Random, n_tool: int) -> list[dict[str, Any]]:
    """Multi-turn conversations of 1-3 task turns; the first `n_tool` rows call the `add` tool."""
    rows, i = [], 0
    add_inputs = [x for n, x in pairs if n == "add"]
    for k in range(n_tool):
        rows.append({"conversations": _tool_conversation(add_inputs[k % len(add_inputs)]), "system": "",
                     "tools": json.dumps(_TOOLS)})
    while i < len(pairs):
        turns = pairs[i:i + rng.randint(1, 3)]
        i += len(turns)
        conv = []
        for name, text in turns:
            conv += [_human(_prompt(name, text)), _gpt(TASKS[name].answer(text))]
        system = SYSTEM_PROMPT if rng.random() < 0.3 else ""
        rows.append({"conversations": conv, "system": system, "tools": "[]"})
    rng.shuffle(rows)
    return rows


def _sharegpt_pref(pairs: list, rng: random.Random) -> list[dict[str, Any]]:
    """Preference conversations: an optional solved turn first, then the judged question."""
    rows = []
    for name, text in pairs:
        conv = []
        if rng.random() < 0.3:
            other, other_text = pairs[rng.randrange(len(pairs))]
            conv += [_human(_prompt(other, other_text)), _gpt(TASKS[other].answer(other_text))]
        conv.append(_human(_prompt(name, text)))
        rows.append({"conversations": conv, "chosen": _gpt(TASKS[name].answer(text)),
                     "rejected": _gpt(TASKS[name].wrong(text))})
    return rows


_PT_SENTENCES: dict[str, Callable[[str], str]] = {
    "parity": lambda x: f"The number {x} is {TASKS['parity'].answer(x)}.",
    "larger": lambda x: f"Of {x}, the larger is {TASKS['larger'].answer(x)}.",
    "add": lambda x: f"{x} = {TASKS['add'].answer(x)}.",
    "words": lambda x: f"{x} is written {TASKS['words'].answer(x)}.",
    "upper": lambda x: f"Uppercase {x} is {TASKS['upper'].answer(x)}.",
    "reverse": lambda x: f"Reversed, {x} reads {TASKS['reverse'].answer(x)}.",
}


def _plain_text(pairs: list, per_line: int) -> list[dict[str, str]]:
    """Pre-training documents: a few true sentences about the tasks per line."""
    sentences = [_PT_SENTENCES[name](text) for name, text in pairs]
    return [{"text": " ".join(sentences[i:i + per_line])} for i in range(0, len(sentences), per_line)]


SFT_TRAIN = {"parity": 400, "larger": 400, "add": 80, "words": 80, "upper": 520, "reverse": 520}
SFT_EVAL = {"parity": 40, "larger": 40, "add": 20, "words": 20, "upper": 40, "reverse": 40}
PREF_TRAIN = {"parity": 200, "larger": 200, "add": 80, "words": 80, "upper": 220, "reverse": 220}
PREF_EVAL = {"parity": 20, "larger": 20, "add": 10, "words": 10, "upper": 20, "reverse": 20}
SMALL_TRAIN = {"parity": 100, "larger": 100, "add": 50, "words": 50, "upper": 100, "reverse": 100}

_ALPACA = {"prompt": "instruction", "query": "input", "response": "output"}
_SHAREGPT_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                  "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system"}
_PREF_ALPACA = {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"}

# LLaMA-Factory's dataset_info.json entries for the files generate_all() produces.
DATASET_INFO: dict[str, dict[str, Any]] = {
    "demo_sft": {"file_name": "demo_sft.json",
                 "columns": {**_ALPACA, "system": "system", "history": "history"}},
    "demo_sft_eval": {"file_name": "demo_sft_eval.json",
                      "columns": {**_ALPACA, "system": "system", "history": "history"}},
    "demo_sharegpt": {"file_name": "demo_sharegpt.json", "formatting": "sharegpt",
                      "columns": {"messages": "conversations", "system": "system", "tools": "tools"},
                      "tags": _SHAREGPT_TAGS},
    "demo_pref": {"file_name": "demo_pref.json", "ranking": True, "columns": _PREF_ALPACA},
    "demo_pref_eval": {"file_name": "demo_pref_eval.json", "ranking": True, "columns": _PREF_ALPACA},
    "demo_pref_sharegpt": {"file_name": "demo_pref_sharegpt.json", "formatting": "sharegpt", "ranking": True,
                           "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"},
                           "tags": _SHAREGPT_TAGS},
    "demo_kto": {"file_name": "demo_kto.json", "columns": {**_ALPACA, "kto_tag": "kto_tag"}},
    "demo_pt": {"file_name": "demo_pt.json", "columns": {"prompt": "text"}},
}


def generate_all(seed: int = DEFAULT_SEED) -> dict[str, list[dict[str, Any]]]:
    """Every demo dataset's rows by dataset name; the same seed always gives the same rows."""
    pools = split_pools(seed)

    def rng(name: str) -> random.Random:
        return random.Random(f"{seed}:{name}:rows")

    return {
        "demo_sft": _alpaca_sft(_sample(pools, 1, SFT_TRAIN, rng("sft")), rng("sft_extra"), extras=True),
        "demo_sft_eval": _alpaca_sft(_sample(pools, 0, SFT_EVAL, rng("sft_eval")), rng("x"), extras=False),
        "demo_sharegpt": _sharegpt_sft(_sample(pools, 1, SMALL_TRAIN, rng("sharegpt")), rng("sg"), n_tool=40),
        "demo_pref": _alpaca_pref(_sample(pools, 1, PREF_TRAIN, rng("pref"))),
        "demo_pref_eval": _alpaca_pref(_sample(pools, 0, PREF_EVAL, rng("pref_eval"))),
        "demo_pref_sharegpt": _sharegpt_pref(_sample(pools, 1, SMALL_TRAIN, rng("pref_sg")), rng("psg")),
        "demo_kto": _alpaca_kto(_sample(pools, 1, PREF_TRAIN, rng("kto")), rng("kto_tag")),
        "demo_pt": _plain_text(_sample(pools, 1, SFT_TRAIN, rng("pt")), per_line=6),
    }


def dumps_rows(rows: list[dict[str, Any]]) -> str:
    """A JSON list with one row per line: small, diffable, and loadable by `datasets`' json builder."""
    return "[\n" + ",\n".join(json.dumps(row, ensure_ascii=False) for row in rows) + "\n]\n"


def write_demo_data(out_dir: str | Path, seed: int = DEFAULT_SEED) -> list[Path]:
    """Write every demo dataset and dataset_info.json into `out_dir`; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, rows in generate_all(seed).items():
        path = out / DATASET_INFO[name]["file_name"]
        path.write_text(dumps_rows(rows), encoding="utf-8")
        written.append(path)
    info = out / "dataset_info.json"
    info.write_text(json.dumps(DATASET_INFO, indent=2) + "\n", encoding="utf-8")
    return [*written, info]


def strings_in(value: Any) -> list[str]:
    """Every string inside a JSON value, in order: the text a tokenizer is trained on."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings_in(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return []


def corpus_texts(data_dir: str | Path | None = None, seed: int = DEFAULT_SEED) -> list[str]:
    """Tokenizer training text: strings of the data files in `data_dir` if present, else freshly generated."""
    names = [entry["file_name"] for entry in DATASET_INFO.values()]
    root = Path(data_dir) if data_dir is not None else None
    if root is not None and all((root / n).is_file() for n in names):
        datasets = [json.loads((root / n).read_text(encoding="utf-8")) for n in names]
    else:
        generated = generate_all(seed)
        datasets = [generated[name] for name in DATASET_INFO]
    return strings_in(datasets)


if __name__ == "__main__":
    for written_path in write_demo_data(sys.argv[1] if len(sys.argv) > 1 else "data"):
        print(written_path)
