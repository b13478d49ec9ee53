"""Throughput of the build-dataset step: `python benchmarks/data_throughput.py [--rows 50000] [--model DIR]`.

Writes a synthetic alpaca file (~50k rows, some with input, history and system), then times a cold build
(`preprocessing_num_workers` 1 and 2) and a warm run (the cache hit, and loading the saved DatasetDict), and
prints examples/s and tokens/s. For reference it also times tokenization alone done the way LLaMA-Factory's
template does it (one tokenizer call per text piece). Figures only: nothing here is asserted.

With `--llamafactory-python PY` (an interpreter where `import llamafactory` works, e.g. a separate venv with
llamafactory 0.9.5: its pins clash with tuneline's), LLaMA-Factory's own `get_dataset` builds the same file with
the same tokenizer and template for each worker count, and the two results are compared row by row.

`python benchmarks/data_throughput.py --template-parity --llamafactory-python .venv-peer/bin/python` encodes the
demo data (`data/demo_sft.json` for sft, `demo_pref.json` and `demo_pref_sharegpt.json` for rm) with every template
both projects have, in both projects, and prints per template whether input ids and labels are identical, then
"N of M templates identical".
The tokenizer is a copy of the tiny one with every stop word added as a special token: LLaMA-Factory adds the
stop words a tokenizer lacks on its side only, which would make the two tokenize them differently. Multimodal
templates (gemma3, llama4, mistral_small) run with LLaMA-Factory's text-only plugin: theirs need an image processor
the tiny model lacks, and leave text without images unchanged.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import tempfile
import time
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


DEMO_DATA = Path(__file__).resolve().parents[1] / "data"
PARITY_DATA = (("sft", "demo_sft"), ("rm", "demo_pref"), ("rm", "demo_pref_sharegpt"))

LLAMAFACTORY_PARITY = """
import json, os, sys
model, data, out, jobs = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
os.environ["HF_DATASETS_CACHE"] = out + "/hf-cache"
os.environ["DISABLE_VERSION_CHECK"] = "1"
from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
from llamafactory.data.mm_plugin import get_mm_plugin
from llamafactory.data.template import TEMPLATES
from llamafactory.hparams import get_train_args
from llamafactory.model import load_tokenizer
built = {}
for template, stage, dataset in jobs:
    if template not in TEMPLATES:
        continue
    args = dict(stage=stage, model_name_or_path=model, do_train=True, dataset=dataset, dataset_dir=data,
                template=template, cutoff_len=1024, output_dir=out + "/o", overwrite_cache=True,
                finetuning_type="lora", report_to="none")
    model_args, data_args, training_args, _, _ = get_train_args(args)
    tokenizer_module = load_tokenizer(model_args)  # a fresh one: the template changes it in place
    fixed = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
    fixed.mm_plugin = get_mm_plugin(name="base")  # image plugins need a processor; text passes them unchanged
    module = get_dataset(fixed, model_args, data_args, training_args, stage, **tokenizer_module)
    path = f"{out}/{template}-{dataset}"
    module["train_dataset"].save_to_disk(path)
    built.setdefault(template, {})[dataset] = path
print(json.dumps(built))
"""


def parity_tokenizer(model: str, out: Path) -> str:
    """A copy of the model's folder whose tokenizer has every built-in template's stop words as special tokens."""
    from transformers import AutoTokenizer

    from tuneline.data.template_catalog import TEMPLATES

    shutil.copytree(model, out, dirs_exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(out)
    stop_words = sorted({word for template in TEMPLATES.values() for word in template.stop_words})
    tokenizer.add_tokens(stop_words, special_tokens=True)
    tokenizer.save_pretrained(out)
    return str(out)


def template_parity(python: str, work: Path, model: str) -> None:
    """Per template: identical, or where each demo file first differs; then the count of identical templates."""
    from datasets import disable_progress_bars, load_from_disk

    from tuneline.data import build_dataset, load_processed
    from tuneline.data.template_catalog import TEMPLATES

    disable_progress_bars()
    model = parity_tokenizer(model, work / "parity-model")
    out = work / "llamafactory-parity"
    jobs = [(name, stage, dataset) for name in TEMPLATES for stage, dataset in PARITY_DATA]
    done = subprocess.run([python, "-c", LLAMAFACTORY_PARITY, model, str(DEMO_DATA), str(out), json.dumps(jobs)],
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"LLaMA-Factory failed:\n{done.stderr[-4000:]}")
    built = json.loads(done.stdout.strip().splitlines()[-1])
    identical = 0
    for name in built:
        problems = []
        for stage, dataset in PARITY_DATA:
            config = make_config(work, model, 1, name, stage=stage, dataset=dataset, dataset_dir=str(DEMO_DATA),
                                 pipeline_cache_dir=str(work / "parity-cache"))
            ours = load_processed(build_dataset(config))["train"]
            theirs = load_from_disk(built[name][dataset])
            columns = [c for c in theirs.column_names if c.endswith(("input_ids", "labels"))]
            if difference := first_difference(ours, theirs, columns):
                problems.append(f"{dataset}: {difference}")
        identical += not problems
        print(f"{name}: {'identical' if not problems else 'differs (' + '; '.join(problems) + ')'}")
    print(f"{identical} of {len(built)} templates identical on LLaMA-Factory's encoding of the demo data; "
          f"not in LLaMA-Factory: {', '.join(sorted(set(TEMPLATES) - set(built))) or 'none'}")


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
                        help="compare every shared template's encoding of the demo data with LLaMA-Factory's")
    args = parser.parse_args()
    if args.template_parity and not args.llamafactory_python:
        parser.error("--template-parity needs --llamafactory-python")
    if args.llamafactory_python and not args.template_parity and args.template == "auto":
        parser.error("LLaMA-Factory has no 'auto' template: pass --template chatml (the tiny tokenizer's format)")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tuneline-bench-"))
    import datasets  # noqa: F401  (imports paid before timing, as in a flow's worker)
    import transformers  # noqa: F401

    model = args.model
    if not model:
        from tuneline.tiny_model import TINY_PRESETS, build_tiny_model

        model = str(build_tiny_model(work / "model", **TINY_PRESETS["test"]))
    if args.template_parity:
        template_parity(args.llamafactory_python, work, model)
    else:
        time_everything(args, work, model)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
