"""Throughput of the build-dataset step: `python benchmarks/data_throughput.py [--rows 50000] [--model DIR]`.

Writes a synthetic alpaca file (~50k rows, some with input, history and system), then times a cold build
(`preprocessing_num_workers` 1 and 2) and a warm run (the cache hit, and loading the saved DatasetDict), and
prints examples/s and tokens/s. For reference it also times tokenization alone done the way LLaMA-Factory's
template does it (one tokenizer call per text piece). Figures only: nothing here is asserted.

With `--llamafactory-python PY` (an interpreter where `import llamafactory` works, e.g. a separate venv with
llamafactory 0.9.5: its pins clash with tuneline's), LLaMA-Factory's own `get_dataset` builds the same file with
the same tokenizer and template for each worker count, and the two results are compared row by row.

`python benchmarks/data_throughput.py --template-parity --llamafactory-python .venv-peer/bin/python` encodes the
demo data with every template both projects have, and thinking rows with every reasoning template under each
setting of `enable_thinking`, `preserve_thinking` and `mask_history`, in both projects (benchmarks/template_parity.py
says which), and prints per template whether input ids and labels are identical, then "N of M templates identical".
The tokenizer is a copy of the tiny one with every stop word, and every token a template's slots name by id, added
as a special token: LLaMA-Factory adds the stop words a tokenizer lacks on its side only, which would make the two
tokenize them differently. Multimodal templates run with LLaMA-Factory's text-only plugin: theirs need an image
processor the tiny model lacks, and leave text without images unchanged.

It then does the same for tool rows (sft): LLaMA-Factory's glaive_toolcall_en_demo and _zh_demo and
tests/fixtures/tool_rows.json (parallel calls, both tool-list forms, non-ASCII arguments, several call rounds, "[]"),
per template on its own tool format and per tool format as a `tool_format` override on qwen3_nothink, llama3's date
pinned on both sides, and prints where each job first differs (row, token, the text on both sides), then
"N of M template/format jobs identical". Rows LLaMA-Factory cannot encode for a job (GLM-4 with several calls in a
turn, ...) and rows tuneline refuses as bad data are left out of both sides, and named. With `--snapshot` it
writes LLaMA-Factory's encoding of the first glaive rows and of tool_rows.json, and the tokenizer files, to
tests/fixtures for tests/integration/data/test_tool_parity.py, which checks tuneline against them without LLaMA-Factory,
and the snapshot of benchmarks/template_parity.py for tests/integration/data/test_template_parity.py.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path

WORDS = ("add the numbers reverse letters which larger even odd uppercase count words sum answer list first last "
         "number text please explain short value result because then").split()


def synthetic_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)

    def words(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(k))

    rows = []
    for i in range(n):
        row = {"instruction": words(rng.randint(4, 20)), "input": words(rng.randint(0, 12)),
               "output": words(rng.randint(5, 60))}
        if i % 5 == 0:
            row["history"] = [[words(6), words(10)]]
        if i % 7 == 0:
            row["system"] = words(8)
        rows.append(row)
    return rows


def write_data(root: Path, rows: list[dict]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "bench.json").write_text(json.dumps(rows))
    columns = {"prompt": "instruction", "query": "input", "response": "output", "history": "history",
               "system": "system"}
    entry = {"file_name": "bench.json", "columns": columns}
    (root / "dataset_info.json").write_text(json.dumps({"bench": entry}))


def make_config(work: Path, model: str, workers: int, template: str, **overrides):
    from tuneline.config import load_config

    values = {
        "model_name_or_path": model, "dataset": "bench", "dataset_dir": str(work / "data"), "template": template,
        "cutoff_len": 1024, "stage": "sft", "preprocessing_num_workers": workers,
        "pipeline_cache_dir": str(work / f"cache-{workers}"), "output_dir": str(work / "out"),
    }
    return load_config(overrides=values | overrides, check_paths=False)


def time_cold(work: Path, model: str, workers: int, template: str) -> dict:
    from tuneline.data import build_dataset

    shutil.rmtree(work / f"cache-{workers}", ignore_errors=True)
    config = make_config(work, model, workers, template)
    start = time.perf_counter()
    ref = build_dataset(config)
    seconds = time.perf_counter() - start
    return {"workers": workers, "seconds": seconds, "rows": ref["train_rows"], "tokens": ref["tokens"],
            "examples_per_s": ref["train_rows"] / seconds, "tokens_per_s": ref["tokens"] / seconds}


def time_warm(work: Path, model: str, template: str) -> dict:
    from tuneline.data import build_dataset, load_processed

    config = make_config(work, model, 1, template)
    start = time.perf_counter()
    ref = build_dataset(config)
    hit = time.perf_counter() - start
    start = time.perf_counter()
    rows = load_processed(ref)["train"].num_rows
    return {"cache_hit": ref["cache_hit"], "hit_seconds": hit, "load_seconds": time.perf_counter() - start,
            "rows": rows}


def time_per_piece_tokenization(model: str, rows: list[dict], template_name: str) -> dict:
    """Reference: the same template pieces tokenized with one call each (LLaMA-Factory's way)."""
    from tuneline.config.args import ModelArgs
    from tuneline.data.template_catalog import get_template
    from tuneline.model.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(ModelArgs(model_name_or_path=model))
    template = get_template(template_name, tokenizer)
    start = time.perf_counter()
    tokens = 0
    for row in rows:
        user = "\n".join(t for t in (row["instruction"], row["input"]) if t)
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": row["output"]}]
        for message in template.pieces(messages, row.get("system"), None):
            for piece in message:
                if isinstance(piece, str):
                    tokens += len(tokenizer.encode(piece, add_special_tokens=False))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "examples_per_s": len(rows) / seconds, "tokens_per_s": tokens / seconds}


LLAMAFACTORY_BUILD = """
import os, sys, time, json
workers, model, data, out, template = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
os.environ["HF_DATASETS_CACHE"] = out + "/hf-cache"
os.environ["DISABLE_VERSION_CHECK"] = "1"
import datasets, transformers, torch  # imports paid before timing, as for tuneline
from llamafactory.hparams import get_train_args
from llamafactory.model import load_tokenizer
from llamafactory.data import get_template_and_fix_tokenizer, get_dataset
args = dict(stage="sft", model_name_or_path=model, do_train=True, dataset="bench", dataset_dir=data,
            template=template, cutoff_len=1024, preprocessing_num_workers=workers if workers > 1 else None,
            output_dir=out + "/o", overwrite_cache=True, finetuning_type="lora", report_to="none",
            tokenized_path=out + f"/tok-{workers}")
start = time.perf_counter()
model_args, data_args, training_args, _, _ = get_train_args(args)
tokenizer_module = load_tokenizer(model_args)
template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
try:
    get_dataset(template, model_args, data_args, training_args, "sft", **tokenizer_module)
except SystemExit:  # it exits after saving to tokenized_path
    pass
print(json.dumps({"seconds": time.perf_counter() - start, "path": out + f"/tok-{workers}"}))
"""


def time_llamafactory(python: str, work: Path, model: str, workers: int, template: str) -> dict:
    out = work / "llamafactory"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    done = subprocess.run([python, "-c", LLAMAFACTORY_BUILD, str(workers), model, str(work / "data"), str(out),
                           template], capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    from datasets import load_from_disk

    train = load_from_disk(result["path"])["train"]
    tokens = sum(len(ids) for ids in train["input_ids"])
    return {**result, "rows": len(train), "tokens": tokens, "examples_per_s": len(train) / result["seconds"],
            "tokens_per_s": tokens / result["seconds"], "train": train}


def first_difference(ours, theirs, columns=("input_ids", "labels")) -> str | None:
    """Where two encoded splits first differ ("row 3 labels"), or None when every column is identical."""
    if len(ours) != len(theirs):
        return f"{len(ours)} rows against {len(theirs)}"
    for column in columns:
        for row, (a, b) in enumerate(zip(ours[column], theirs[column], strict=True)):
            if list(a) != list(b):
                return f"row {row} {column}"
    return None


def compare_with_llamafactory(python: str, work: Path, model: str, template: str) -> None:
    from tuneline.data import build_dataset, load_processed

    ours = load_processed(build_dataset(make_config(work, model, 1, template)))["train"]
    for workers in (1, 2):
        r = time_llamafactory(python, work, model, workers, template)
        print(f"LLaMA-Factory cold build, workers={workers}: {r['seconds']:.2f} s, {r['examples_per_s']:.0f} "
              f"examples/s, {r['tokens_per_s']:.0f} tokens/s ({r['rows']} rows, {r['tokens']} tokens); "
              f"same input_ids and labels as tuneline: {first_difference(ours, r['train']) is None}")


def parity_tokenizer(model: str, out: Path) -> str:
    """A copy of the model's folder whose tokenizer is the snapshots' (tests/fixtures/template_parity_tokenizer) with
    every built-in template's stop words, and the tokens its slots name by id (chatglm3's `<|user|>`, yuan's `<sep>`),
    as special tokens: words it lacks are added after its own, so the ids the snapshots hold stay what they are."""
    from transformers import AutoTokenizer

    from tuneline.data.template_catalog import TEMPLATES
    from tuneline.data.templates import BOS, EOS, Special

    shutil.copytree(model, out, dirs_exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(SNAPSHOT_TOKENIZER)
    stop_words = {word for template in TEMPLATES.values() for word in template.stop_words}
    named = {slot.name for template in TEMPLATES.values() for slots in (*template.slots.values(), template.prefix)
             for slot in slots if isinstance(slot, Special) and slot not in (BOS, EOS)}
    tokenizer.add_tokens(sorted((stop_words | named) - set(tokenizer.get_vocab())), special_tokens=True)
    tokenizer.save_pretrained(out)
    return str(out)


FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
LLAMAFACTORY_DATA = FIXTURES / "llamafactory" / "0.9.5" / "data"
TOOL_DATA = {  # name -> (file, dataset_info entry); rows numbered from 1, as tuneline's bad-row messages count them
    "glaive_toolcall_en_demo": (LLAMAFACTORY_DATA / "glaive_toolcall_en_demo.json", None),  # entry: LLaMA-Factory's
    "glaive_toolcall_zh_demo": (LLAMAFACTORY_DATA / "glaive_toolcall_zh_demo.json", None),
    "tool_rows": (FIXTURES / "tool_rows.json", {"formatting": "sharegpt", "columns": {
        "messages": "conversations", "system": "system", "tools": "tools"}}),
}
TOOL_DATE = "26 Jul 2024"  # llama3's tool prompt writes the date: pinned on both sides
TOOL_CUTOFF = 16384  # above the longest glaive row on the tiny tokenizer (~12k tokens): whole rows are compared
TOOL_FORMAT_TEMPLATE = "qwen3_nothink"  # the template every tool format is tried on, as a `tool_format` override
SNAPSHOT = FIXTURES / "llamafactory" / "0.9.5" / "tool_parity.json.xz"  # xz: jobs repeat the same rows' tokens
SNAPSHOT_TOKENIZER = FIXTURES / "template_parity_tokenizer"  # mm_parity's parity_tokenizer and the templates' words
SNAPSHOT_ROWS = 20  # the first rows of each glaive file (and every row of tool_rows) go into the snapshot


def tool_jobs(templates, formats) -> list[tuple[str, str | None]]:
    """(template, tool_format override or None): every template on its own format, then every format on one."""
    return [(name, None) for name in templates] + [(TOOL_FORMAT_TEMPLATE, name) for name in formats]


def job_name(template: str, tool_format: str | None) -> str:
    return template if tool_format is None else f"{template} + tool_format {tool_format}"


def read_rows(name: str) -> list[dict]:
    return json.loads(TOOL_DATA[name][0].read_text())


def write_tool_data(root: Path, keep: dict[str, list[int]]) -> Path:
    """A dataset_dir holding, per tool dataset, the rows numbered in `keep` (from 1), in their order."""
    root.mkdir(parents=True, exist_ok=True)
    llamafactory_info = json.loads((LLAMAFACTORY_DATA / "dataset_info.json").read_text())
    info = {}
    for name, rows in keep.items():
        all_rows = read_rows(name)
        (root / f"{name}.json").write_text(json.dumps([all_rows[i - 1] for i in rows], ensure_ascii=False))
        info[name] = {**(TOOL_DATA[name][1] or llamafactory_info[name]), "file_name": f"{name}.json"}
    (root / "dataset_info.json").write_text(json.dumps(info))
    return root


def without(keep: dict[str, list[int]], excluded: dict[str, dict]) -> dict[str, list[int]]:
    """`keep` less the rows `excluded` names ({dataset: {row: why}}, rows as JSON keys or ints)."""
    return {name: [r for r in rows if str(r) not in {str(k) for k in excluded.get(name, {})}]
            for name, rows in keep.items()}


def tool_config(work: Path, model: str, data: Path, template: str, tool_format: str | None, **overrides):
    """The build-dataset config of one tool job: every tool dataset concatenated, the date pinned, whole rows."""
    return make_config(work, model, 1, template, dataset=",".join(TOOL_DATA), dataset_dir=str(data),
                       tool_format=tool_format, tool_date=TOOL_DATE, cutoff_len=TOOL_CUTOFF, **overrides)


def tuneline_refusals(work: Path, model: str) -> dict[str, dict[int, str]]:
    """Rows tuneline's reading refuses as bad data, whatever the template ({dataset: {row: reason}})."""
    from tuneline.data.loader import load_examples

    data = write_tool_data(work / "tool-data-all", {name: list(range(1, len(read_rows(name)) + 1))
                                                    for name in TOOL_DATA})
    config = tool_config(work, model, data, TOOL_FORMAT_TEMPLATE, None, on_bad_rows="skip")
    refused: dict[str, dict[int, str]] = {}
    for bad in load_examples(config, config.dataset_names).bad:
        refused.setdefault(Path(bad.file).stem, {})[bad.row] = f"{bad.reason}: {bad.detail}"
    return refused


LLAMAFACTORY_TOOL_PARITY = """
import datetime, json, os, shutil, sys
model, data, out, jobs, day, cutoff = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), sys.argv[5], \\
    int(sys.argv[6])
os.environ["HF_DATASETS_CACHE"] = out + "/hf-cache"
os.environ["DISABLE_VERSION_CHECK"] = "1"
import llamafactory
import llamafactory.data.tool_utils as tool_utils
from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
from llamafactory.data.converter import get_dataset_converter
from llamafactory.data.mm_plugin import get_mm_plugin
from llamafactory.data.parser import get_dataset_list
from llamafactory.data.template import TEMPLATES
from llamafactory.hparams import get_train_args
from llamafactory.model import load_tokenizer


class FixedDate(datetime.datetime):  # llama3's tool prompt writes datetime.now(): the date tuneline pins
    @classmethod
    def now(cls, tz=None):
        return cls.strptime(day, "%d %b %Y")


tool_utils.datetime = FixedDate
info = json.load(open(os.path.join(data, "dataset_info.json")))
names = list(info)


def unusable(example, template, tokenizer):
    prompt, response = example["_prompt"], example["_response"]
    if len(prompt) % 2 != 1 or len(response) != 1:
        return "LLaMA-Factory drops it (roles out of order)"
    try:
        template.encode_multiturn(tokenizer, prompt + response, example["_system"], example["_tools"])
    except Exception as exc:
        return f"LLaMA-Factory raises {type(exc).__name__}: {exc}"


def excluded_rows(template, tokenizer, data_args):
    excluded = {}
    for name, attr in zip(names, get_dataset_list(names, data)):
        convert = get_dataset_converter(attr.formatting, attr, data_args)
        for row, raw in enumerate(json.load(open(os.path.join(data, info[name]["file_name"]))), 1):
            if why := unusable(convert(raw), template, tokenizer):
                excluded.setdefault(name, {})[row] = why
    return excluded


def filtered_data(folder, excluded):
    os.makedirs(folder, exist_ok=True)
    shutil.copy(os.path.join(data, "dataset_info.json"), folder)
    for name in names:
        rows = json.load(open(os.path.join(data, info[name]["file_name"])))
        kept = [r for i, r in enumerate(rows, 1) if i not in excluded.get(name, {})]
        json.dump(kept, open(os.path.join(folder, info[name]["file_name"]), "w"), ensure_ascii=False)
    return folder


built = {"version": llamafactory.__version__, "formats": sorted(tool_utils.TOOLS), "jobs": {}}
for index, (template, tool_format) in enumerate(jobs):
    if template not in TEMPLATES or (tool_format and tool_format not in tool_utils.TOOLS):
        continue
    args = dict(stage="sft", model_name_or_path=model, do_train=True, dataset=",".join(names), dataset_dir=data,
                template=template, tool_format=tool_format, cutoff_len=cutoff, output_dir=out + "/o",
                overwrite_cache=True, finetuning_type="lora", report_to="none")
    model_args, data_args, training_args, _, _ = get_train_args(args)
    tokenizer_module = load_tokenizer(model_args)  # a fresh one: the template changes it in place
    fixed = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
    fixed.mm_plugin = get_mm_plugin(name="base")  # image plugins need a processor; text passes them unchanged
    excluded = excluded_rows(fixed, tokenizer_module["tokenizer"], data_args)
    if excluded:
        data_args.dataset_dir = filtered_data(f"{out}/data-{index}", excluded)
    module = get_dataset(fixed, model_args, data_args, training_args, "sft", **tokenizer_module)
    path = f"{out}/tools-{index}"
    module["train_dataset"].save_to_disk(path)
    built["jobs"][f"{template}|{tool_format or ''}"] = {"path": path, "excluded": excluded}
print(json.dumps(built))
"""


def llamafactory_tool_encodings(python: str, work: Path, model: str, data: Path, jobs) -> dict:
    """LLaMA-Factory's encoding of the tool datasets per job, and the rows it cannot encode (left out)."""
    out = work / "llamafactory-tools"
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([python, "-c", LLAMAFACTORY_TOOL_PARITY, model, str(data), str(out), json.dumps(jobs),
                           TOOL_DATE, str(TOOL_CUTOFF)], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"LLaMA-Factory failed on the tool rows:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def first_token_difference(ours: list[int], theirs: list[int]) -> int | None:
    """The first position where two id lists differ (the shorter one's length when one extends the other)."""
    for position, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return position
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def decoded_at(tokenizer, ids: list[int], position: int, before: int = 12, after: int = 40) -> str:
    return tokenizer.decode(ids[max(0, position - before):position + after])


def row_difference(tokenizer, where: str, ours: dict, theirs: dict) -> str | None:
    """Where one encoded row first differs from LLaMA-Factory's, with the text around it on both sides."""
    ours_ids, theirs_ids = list(ours["input_ids"]), list(theirs["input_ids"])
    position = first_token_difference(ours_ids, theirs_ids)
    if position is not None:
        return (f"{where} input_ids at token {position}:\n    tuneline:      "
                f"{decoded_at(tokenizer, ours_ids, position)!r}\n    LLaMA-Factory: "
                f"{decoded_at(tokenizer, theirs_ids, position)!r}")
    position = first_token_difference(list(ours["labels"]), list(theirs["labels"]))
    if position is not None:
        return (f"{where} labels at token {position} ({ours['labels'][position]} against "
                f"{theirs['labels'][position]}) under {decoded_at(tokenizer, ours_ids, position)!r}")
    return None


def row_names(keep: dict[str, list[int]]) -> list[str]:
    return [f"{name} row {row}" for name, rows in keep.items() for row in rows]


def compare_tool_job(tokenizer, config, theirs, keep: dict[str, list[int]]) -> str | None:
    """None when tuneline's build of `config` gives LLaMA-Factory's rows, else where it first differs."""
    from tuneline.data import build_dataset, load_processed
    from tuneline.errors import DataError

    try:
        ours = load_processed(build_dataset(config))["train"]
    except DataError as exc:
        return f"tuneline refuses (its rows count the job's file, less the rows left out): {exc}"
    if len(ours) != len(theirs):
        return f"{len(ours)} rows against {len(theirs)}"
    for where, a, b in zip(row_names(keep), ours, theirs, strict=True):
        if difference := row_difference(tokenizer, where, a, b):
            return difference
    return None


def tuneline_on_row(work: Path, model: str, template: str, tool_format: str | None, name: str, row) -> str:
    """What tuneline does with one row LLaMA-Factory cannot encode: refuse it too (a bad row), or encode it."""
    from tuneline.data import build_dataset
    from tuneline.errors import DataError

    data = write_tool_data(work / "tool-data-one", {name: [int(row)]})
    config = make_config(work, model, 1, template, dataset=name, dataset_dir=str(data), tool_format=tool_format,
                         tool_date=TOOL_DATE, cutoff_len=TOOL_CUTOFF, pipeline_cache_dir=str(work / "tool-cache"))
    try:
        build_dataset(config)
    except DataError:
        return "tuneline refuses it too"
    return "tuneline encodes it"


def left_out(excluded: dict[str, dict], verdict) -> str:
    """The rows left out of a job, why, and what tuneline does with each (`verdict(name, row)`)."""
    rows = [f"{name} row {row}: {why if len(why) < 90 else why[:87] + '...'}; {verdict(name, row)}"
            for name, by_row in excluded.items() for row, why in by_row.items()]
    return f"; left out: {'. '.join(rows)}" if rows else ""


def run_tool_job(work: Path, model: str, tokenizer, data: Path, keep: dict, key: str, job: dict) -> tuple:
    """One template/format job: tuneline's build against LLaMA-Factory's rows, printed; (identical, its results)."""
    from datasets import load_from_disk

    template, tool_format = key.split("|")
    tool_format = tool_format or None
    job_keep = without(keep, job["excluded"])
    job_data = write_tool_data(work / f"tool-data-{key.replace('|', '-')}", job_keep) if job["excluded"] else data
    config = tool_config(work, model, job_data, template, tool_format, pipeline_cache_dir=str(work / "tool-cache"))
    theirs = load_from_disk(job["path"])
    difference = compare_tool_job(tokenizer, config, theirs, job_keep)
    verdict = partial(tuneline_on_row, work, model, template, tool_format)
    print(f"{job_name(template, tool_format)}: {'identical' if difference is None else 'differs, ' + difference} "
          f"({len(theirs)} rows{left_out(job['excluded'], verdict)})")
    return difference is None, (job_keep, theirs, job["excluded"])


def tool_parity(python: str, work: Path, model: str, snapshot: bool, snapshot_rows_only: bool = False) -> None:
    """Per template and tool format: identical on the tool rows, or where they first differ; then the count.
    `snapshot_rows_only`: only the rows the snapshot keeps are encoded and compared."""
    from transformers import AutoTokenizer

    from tuneline.data.template_catalog import TEMPLATES
    from tuneline.data.tools import TOOL_FORMATS

    refused = tuneline_refusals(work, model)
    limit = {name: SNAPSHOT_ROWS if snapshot_rows_only and name.startswith("glaive") else len(read_rows(name))
             for name in TOOL_DATA}
    keep = without({name: list(range(1, limit[name] + 1)) for name in TOOL_DATA}, refused)
    data = write_tool_data(work / "tool-data", keep)
    built = llamafactory_tool_encodings(python, work, model, data, tool_jobs(TEMPLATES, TOOL_FORMATS))
    tokenizer = AutoTokenizer.from_pretrained(model)
    for name, rows in refused.items():
        for row, why in rows.items():
            print(f"left out of every job (tuneline refuses it, LLaMA-Factory encodes it): {name} row {row}: {why}")
    identical, results = 0, {}
    for key, job in built["jobs"].items():
        same, results[key] = run_tool_job(work, model, tokenizer, data, keep, key, job)
        identical += same
    shared = {key.split("|")[0] for key in built["jobs"]}
    print(f"{identical} of {len(built['jobs'])} template/format jobs identical on the tool rows "
          f"(LLaMA-Factory {built['version']}, date {TOOL_DATE}); not in LLaMA-Factory: "
          f"{', '.join(sorted(set(TEMPLATES) - shared)) or 'none'}; its tool formats not in tuneline: "
          f"{', '.join(sorted(set(built['formats']) - set(TOOL_FORMATS))) or 'none'}")
    if snapshot:
        write_snapshot(results, built["version"], model)


def label_runs(input_ids: list[int], labels: list[int]) -> list[list]:
    """Labels as [count, value] runs, value None where the label is the input id (the snapshot's compact form)."""
    runs: list[list] = []
    for token, label in zip(input_ids, labels, strict=True):
        value = None if label == token else label
        if runs and runs[-1][1] == value:
            runs[-1][0] += 1
        else:
            runs.append([1, value])
    return runs


def labels_from_runs(input_ids: list[int], runs: list[list]) -> list[int]:
    labels: list[int] = []
    for count, value in runs:
        labels += input_ids[len(labels):len(labels) + count] if value is None else [value] * count
    return labels


def snapshot_job(job_keep: dict[str, list[int]], theirs) -> dict:
    """One job's LLaMA-Factory rows among the snapshot's rows (the first SNAPSHOT_ROWS of each glaive file)."""
    limit = {name: SNAPSHOT_ROWS if name.startswith("glaive") else len(read_rows(name)) for name in TOOL_DATA}
    rows, input_ids, labels = {name: [] for name in TOOL_DATA}, [], []
    where = [(name, row) for name, kept in job_keep.items() for row in kept]
    for (name, row), encoded in zip(where, theirs, strict=True):
        if row <= limit[name]:
            rows[name].append(row)
            input_ids.append(list(encoded["input_ids"]))
            labels.append(label_runs(encoded["input_ids"], encoded["labels"]))
    return {"rows": rows, "input_ids": input_ids, "labels": labels}


def write_snapshot(results: dict, version: str, model: str) -> None:
    """LLaMA-Factory's encodings of the snapshot rows per job, and the tokenizer files they were made with."""
    import lzma

    from transformers import AutoTokenizer

    shutil.rmtree(SNAPSHOT_TOKENIZER, ignore_errors=True)
    AutoTokenizer.from_pretrained(model).save_pretrained(SNAPSHOT_TOKENIZER)
    jobs = []
    for key, (job_keep, theirs, excluded) in results.items():
        template, tool_format = key.split("|")
        jobs.append({"template": template, "tool_format": tool_format or None, "left_out": excluded,
                     **snapshot_job(job_keep, theirs)})
    snapshot = {
        "llamafactory": version, "tool_date": TOOL_DATE, "cutoff_len": TOOL_CUTOFF, "stage": "sft",
        "tokenizer": f"tests/fixtures/{SNAPSHOT_TOKENIZER.name}: the tiny model's ('test' preset) with every "
                     "template's stop words and named tokens added as special tokens (data_throughput.parity_tokenizer)",
        "rows": f"the first {SNAPSHOT_ROWS} rows of each glaive file and every row of tool_rows, less those "
                "LLaMA-Factory cannot encode or tuneline refuses as bad data (numbered from 1)",
        "labels": "[count, value] runs, value null where the label is the input id",
        "command": "python benchmarks/data_throughput.py --template-parity --snapshot --snapshot-rows-only "
                   "--llamafactory-python .venv-peer/bin/python",
        "jobs": jobs,
    }
    text = json.dumps(snapshot, separators=(",", ":"), ensure_ascii=False).encode()
    SNAPSHOT.write_bytes(lzma.compress(text, preset=9 | lzma.PRESET_EXTREME))
    print(f"wrote {SNAPSHOT} ({SNAPSHOT.stat().st_size / 1e3:.0f} kB; {len(text) / 1e6:.1f} MB of JSON, {len(jobs)} "
          f"jobs) and the tokenizer files in {SNAPSHOT_TOKENIZER}")


def read_snapshot() -> dict:
    import lzma

    return json.loads(lzma.decompress(SNAPSHOT.read_bytes()))


def time_everything(args, work: Path, model: str) -> None:
    rows = synthetic_rows(args.rows)
    write_data(work / "data", rows)
    print(f"{args.rows} alpaca rows, tokenizer {model}, template {args.template}, workdir {work}")
    for workers in (1, 2):
        r = time_cold(work, model, workers, args.template)
        print(f"cold build, workers={workers}: {r['seconds']:.2f} s, {r['examples_per_s']:.0f} examples/s, "
              f"{r['tokens_per_s']:.0f} tokens/s ({r['rows']} rows, {r['tokens']} tokens)")
    w = time_warm(work, model, args.template)
    print(f"warm: cache hit {w['hit_seconds'] * 1000:.1f} ms (hit={w['cache_hit']}), "
          f"load_processed {w['load_seconds'] * 1000:.1f} ms ({w['rows']} rows)")
    p = time_per_piece_tokenization(model, rows, args.template)
    print(f"reference, tokenization only with one tokenizer call per piece: {p['seconds']:.2f} s, "
          f"{p['examples_per_s']:.0f} examples/s, {p['tokens_per_s']:.0f} tokens/s")
    if args.llamafactory_python:
        compare_with_llamafactory(args.llamafactory_python, work, model, args.template)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--model", help="tokenizer folder; default: a freshly built tiny model")
    parser.add_argument("--template", default="auto")
    parser.add_argument("--workdir", help="keep files here instead of a temporary folder")
    parser.add_argument("--llamafactory-python", help="interpreter with llamafactory installed, for a side-by-side")
    parser.add_argument("--template-parity", action="store_true",
                        help="compare every shared template's encoding of the demo data and tool rows with "
                             "LLaMA-Factory's")
    parser.add_argument("--snapshot-rows-only", action="store_true",
                        help="with --template-parity: encode and compare only the rows the snapshots keep")
    parser.add_argument("--snapshot", action="store_true",
                        help="with --template-parity: also write LLaMA-Factory's encodings to the snapshots "
                             f"make test checks ({SNAPSHOT.name} and template_parity.json.xz)")
    args = parser.parse_args()
    if args.template_parity and not args.llamafactory_python:
        parser.error("--template-parity needs --llamafactory-python")
    if args.snapshot and not args.template_parity:
        parser.error("--snapshot needs --template-parity")
    if args.llamafactory_python and not args.template_parity and args.template == "auto":
        parser.error("LLaMA-Factory has no 'auto' template: pass --template chatml (the tiny tokenizer's format)")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tuneline-bench-"))
    import datasets  # noqa: F401  (imports paid before timing, as in a flow's worker)
    import transformers  # noqa: F401

    model = args.model
    if not model:
        from tuneline.demo.tiny_model import TINY_PRESETS, build_tiny_model

        model = str(build_tiny_model(work / "model", **TINY_PRESETS["test"]))
    if args.template_parity:
        from template_parity import template_parity  # beside this script

        parity_model = parity_tokenizer(model, work / "parity-model")
        template_parity(args.llamafactory_python, work, parity_model, args.snapshot, args.snapshot_rows_only)
        tool_parity(args.llamafactory_python, work, parity_model, args.snapshot, args.snapshot_rows_only)
    else:
        time_everything(args, work, model)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
