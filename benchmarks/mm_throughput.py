"""Encoding throughput of image rows against LLaMA-Factory 0.9.5: `python benchmarks/mm_throughput.py
--llamafactory-python .venv-peer/bin/python [--preset llava] [--rows 300] [--repeats 3]`.

LLaMA-Factory's `mllm_demo` (6 sharegpt rows, 8 images) replicated to `--rows` rows, each copy naming its own copies
of the image files (so nothing is read from the same path twice), encoded for sft with a tiny vision-language model
(`tuneline tiny-model --preset llava|gemma3`) and its template, cutoff_len 1024, one worker:
- tuneline: the library function the build-dataset task calls (`tuneline.data.build_dataset`), cold (empty step
  cache) and then again unchanged (the cache hit: content key of config, data and image files, then the saved
  entry), plus loading the saved DatasetDict as the train step does;
- LLaMA-Factory: its `get_dataset` with the same model, template and rows, cold (empty datasets cache; it also saves
  to `tokenized_path`), then warm twice: with its datasets cache (same HF_DATASETS_CACHE, no tokenized_path: the map's
  cache files are reused) and from `tokenized_path` (it loads the saved dataset).
Every figure is timed inside its own process after the heavy imports (torch, transformers, datasets), medians of
`--repeats`. Both sides expand each image to its tokens at this step and decode the pixels only in the collator.
It also says whether the two encodings (input_ids and labels) are identical row by row. Figures only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from data_throughput import first_difference, make_config, time_cold, time_warm  # noqa: E402 - the benchmark folder's helpers

DEMO = HERE.parent / "tests" / "fixtures" / "llamafactory" / "0.9.5" / "data"
SHAREGPT = {"formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"},
            "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}


def write_mm_data(root: Path, rows: int, name: str = "bench") -> None:
    """`rows` rows of mllm_demo in turn, copy k naming images under mllm_copies/k/, as dataset `name` of `root`."""
    demo = json.loads((DEMO / "mllm_demo.json").read_text())
    out = []
    for i in range(rows):
        row, copy = demo[i % len(demo)], i // len(demo)
        images = []
        for image in row["images"]:
            target = root / "mllm_copies" / str(copy) / Path(image).name
            if not target.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(DEMO / image, target)
            images.append(str(target.relative_to(root)))
        out.append({"messages": row["messages"], "images": images})
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{name}.json").write_text(json.dumps(out))
    info = root / "dataset_info.json"
    entries = json.loads(info.read_text()) if info.is_file() else {}
    info.write_text(json.dumps({**entries, name: {"file_name": f"{name}.json", **SHAREGPT}}, indent=2))


LLAMAFACTORY_ENCODE = """
import json, os, sys, time
model, data, out, template, tokenized, overwrite = sys.argv[1:7]
os.environ["HF_DATASETS_CACHE"] = out + "/hf-cache"
os.environ["DISABLE_VERSION_CHECK"] = "1"
import datasets, transformers, torch  # imports paid before timing, as for tuneline
from llamafactory.hparams import get_train_args
from llamafactory.model import load_tokenizer
from llamafactory.data import get_template_and_fix_tokenizer, get_dataset
args = dict(stage="sft", model_name_or_path=model, do_train=True, dataset="bench", dataset_dir=data,
            template=template, cutoff_len=1024, output_dir=out + "/o", overwrite_cache=overwrite == "1",
            finetuning_type="lora", report_to="none", **({"tokenized_path": tokenized} if tokenized else {}))
start = time.perf_counter()
model_args, data_args, training_args, _, _ = get_train_args(args)
tokenizer_module = load_tokenizer(model_args)
template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
try:
    module = get_dataset(template, model_args, data_args, training_args, "sft", **tokenizer_module)
    rows = len(module["train_dataset"])
except SystemExit:  # it exits after saving to a new tokenized_path
    rows = None
print(json.dumps({"seconds": time.perf_counter() - start, "rows": rows}))
"""


def llamafactory_run(python: str, work: Path, model: str, template: str, tokenized: str, overwrite: bool) -> dict:
    out = work / "llamafactory"
    done = subprocess.run([python, "-c", LLAMAFACTORY_ENCODE, model, str(work / "data"), str(out), template,
                           tokenized, "1" if overwrite else "0"], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"LLaMA-Factory failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def llamafactory_round(python: str, work: Path, model: str, template: str) -> dict:
    """Cold (fresh datasets cache, saved to tokenized_path), warm from its datasets cache, warm from tokenized_path."""
    shutil.rmtree(work / "llamafactory", ignore_errors=True)
    tokenized = str(work / "llamafactory" / "tokenized")
    cold = llamafactory_run(python, work, model, template, tokenized, overwrite=False)
    cache = llamafactory_run(python, work, model, template, "", overwrite=False)
    saved = llamafactory_run(python, work, model, template, tokenized, overwrite=False)
    return {"cold": cold["seconds"], "datasets_cache": cache["seconds"], "tokenized_path": saved["seconds"],
            "rows": cache["rows"], "path": tokenized}


def median_of(rounds: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llamafactory-python", required=True, help="an interpreter where llamafactory 0.9.5 imports")
    parser.add_argument("--preset", default="llava", choices=("llava", "gemma3"), help="the tiny model and template")
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import datasets  # noqa: F401 - imports paid before timing, as on LLaMA-Factory's side
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from datasets import load_from_disk

    from tuneline.data import build_dataset, load_processed
    from tuneline.demo.tiny_vlm import build_tiny_vlm

    with tempfile.TemporaryDirectory(prefix="mm-throughput-") as tmp:
        work = Path(tmp)
        model = str(build_tiny_vlm(work / "model", args.preset))
        write_mm_data(work / "data", args.rows)
        ours, theirs = [], []
        for _ in range(args.repeats):
            cold = time_cold(work, model, 1, args.preset)
            warm = time_warm(work, model, args.preset)
            assert warm["cache_hit"], "the unchanged second build should be a cache hit"
            ours.append({"cold": cold["seconds"], "hit": warm["hit_seconds"],
                         "hit_and_load": warm["hit_seconds"] + warm["load_seconds"], "rows": cold["rows"]})
            theirs.append(llamafactory_round(args.llamafactory_python, work, model, args.preset))
        mine = load_processed(build_dataset(make_config(work, model, 1, args.preset)))["train"]
        difference = first_difference(mine, load_from_disk(theirs[-1]["path"])["train"])
    rows = ours[0]["rows"]
    table = [("tuneline", "cold (empty step cache)", median_of(ours, "cold")),
             ("tuneline", "cache hit (content key + saved entry)", median_of(ours, "hit")),
             ("tuneline", "cache hit + loading the DatasetDict", median_of(ours, "hit_and_load")),
             ("LLaMA-Factory", "cold (empty datasets cache, saves tokenized_path)", median_of(theirs, "cold")),
             ("LLaMA-Factory", "warm: its datasets cache", median_of(theirs, "datasets_cache")),
             ("LLaMA-Factory", "warm: load tokenized_path", median_of(theirs, "tokenized_path"))]
    print(f"\n{rows} rows of mllm_demo ({args.preset} tiny model and template), median of {args.repeats}; "
          f"LLaMA-Factory encoded {theirs[0]['rows']} rows")
    print("| system | run | seconds | rows/s |\n|---|---|---|---|")
    for system, run, seconds in table:
        print(f"| {system} | {run} | {seconds:.3f} | {rows / seconds:.0f} |")
    print(f"\ninput_ids and labels identical to LLaMA-Factory's, every row: {difference is None}"
          f"{'' if difference is None else ' (first difference: ' + difference + ')'}")
    print(json.dumps({"preset": args.preset, "rows": rows, "repeats": args.repeats, "tuneline": ours,
                      "llamafactory": [{k: v for k, v in r.items() if k != "path"} for r in theirs],
                      "identical": difference is None}))


if __name__ == "__main__":
    main()
