"""Every chat template both projects have, encoded by LLaMA-Factory and by tuneline, compared row by row.

Run through `python benchmarks/data_throughput.py --template-parity --llamafactory-python .venv-peer/bin/python`
(`--snapshot` also writes the snapshots `make test` checks). Two kinds of jobs, each a template, a stage, datasets
and data keys:
- the demo data with every template: `data/demo_sft.json` for sft (one and several turns, with and without a system
  prompt), `demo_pref.json` and `demo_pref_sharegpt.json` for rm (pairs);
- the rows of tests/fixtures/thinking_rows.json (answers with and without thoughts, in earlier turns and the last)
  with every reasoning template, under each setting of `enable_thinking`, `preserve_thinking` and `mask_history`.
It prints per template whether input ids and labels are identical, then "N of M templates identical"; the snapshot
(tests/fixtures/llamafactory/0.9.5/template_parity.json.xz) keeps LLaMA-Factory's encoding of a few demo rows of
each kind and of every thinking row, for tests/integration/data/test_template_parity.py.
"""

from __future__ import annotations

import importlib.util
import json
import lzma
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO_DATA = ROOT / "data"
FIXTURES = ROOT / "tests" / "fixtures"
THINKING_ROWS = FIXTURES / "thinking_rows.json"
SNAPSHOT = FIXTURES / "llamafactory" / "0.9.5" / "template_parity.json.xz"
DEMO_JOBS = (("sft", "demo_sft"), ("rm", "demo_pref,demo_pref_sharegpt"))
SHAREGPT = {"formatting": "sharegpt", "columns": {"messages": "conversations", "system": "system"},
            "tags": {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt"}}
THINKING_INFO = {"thinking_sft": {**SHAREGPT, "file_name": "thinking_sft.json"},
                 "thinking_pref": {**SHAREGPT, "file_name": "thinking_pref.json", "ranking": True,
                                   "columns": {**SHAREGPT["columns"], "chosen": "chosen", "rejected": "rejected"}}}
THINKING_SETTINGS = {  # stage -> the data keys tried, each beside LLaMA-Factory's defaults
    "sft": ({}, {"enable_thinking": False}, {"mask_history": True}, {"mask_history": True, "preserve_thinking": True},
            {"enable_thinking": False, "preserve_thinking": True}),
    "rm": ({}, {"enable_thinking": False}, {"preserve_thinking": True},
           {"enable_thinking": False, "preserve_thinking": True}),
}
CUTOFF = 1024


def _load_data_throughput():
    spec = importlib.util.spec_from_file_location("data_throughput", Path(__file__).with_name("data_throughput.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _load_data_throughput()


def demo_rows(dataset: str) -> list[int]:
    """The demo rows the snapshot keeps (numbered from 0): a few plain ones, with history, with a system prompt."""
    rows = json.loads((DEMO_DATA / f"{dataset}.json").read_text())
    kinds = (lambda r: not r.get("history") and not r.get("system"), lambda r: r.get("history"),
             lambda r: r.get("system"), lambda r: len(r.get("conversations", [])) > 1)
    picked = sorted({i for kind in kinds for i in [i for i, r in enumerate(rows) if kind(r)][:3]})
    return picked


def write_job_data(root: Path, datasets: str, rows: dict[str, list[int]] | None) -> Path:
    """A dataset_dir with each of `datasets` (demo or thinking), cut to `rows` ({dataset: row numbers}) if given."""
    root.mkdir(parents=True, exist_ok=True)
    demo_info = json.loads((DEMO_DATA / "dataset_info.json").read_text())
    thinking = json.loads(THINKING_ROWS.read_text())
    info = {}
    for name in datasets.split(","):
        all_rows = thinking[name.removeprefix("thinking_")] if name in THINKING_INFO else json.loads(
            (DEMO_DATA / f"{name}.json").read_text())
        kept = all_rows if rows is None or name not in rows else [all_rows[i] for i in rows[name]]
        (root / f"{name}.json").write_text(json.dumps(kept, ensure_ascii=False))
        info[name] = {**(THINKING_INFO.get(name) or demo_info[name]), "file_name": f"{name}.json"}
    (root / "dataset_info.json").write_text(json.dumps(info))
    return root


def parity_jobs(templates: dict) -> list[dict]:
    """Every template on the demo data; every reasoning template on the thinking rows under each setting."""
    jobs = [{"template": name, "stage": stage, "dataset": dataset, "keys": {}}
            for name in templates for stage, dataset in DEMO_JOBS]
    jobs += [{"template": name, "stage": stage, "dataset": f"thinking_{'sft' if stage == 'sft' else 'pref'}",
              "keys": keys} for name, template in templates.items() if template.reasoning
             for stage, settings in THINKING_SETTINGS.items() for keys in settings]
    return jobs


def job_name(job: dict) -> str:
    keys = ", ".join(f"{k}={v}" for k, v in job["keys"].items())
    return f"{job['template']} {job['stage']} {job['dataset']}" + (f" ({keys})" if keys else "")


LLAMAFACTORY_PARITY = """
import json, os, sys
model, out, jobs, cutoff = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
os.environ["HF_DATASETS_CACHE"] = out + "/hf-cache"
os.environ["DISABLE_VERSION_CHECK"] = "1"
import llamafactory
from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
from llamafactory.data.mm_plugin import get_mm_plugin
from llamafactory.data.template import TEMPLATES
from llamafactory.hparams import get_train_args
from llamafactory.model import load_tokenizer


def text_turns(t):  # what a template writes around text, as one string per part
    parts = [t.format_user, t.format_assistant, t.format_system, t.format_observation, t.format_prefix]
    return [repr(part.slots) for part in parts] + [repr(x) for x in (t.default_system, t.stop_words,
            t.thought_words, t.efficient_eos, t.replace_eos, type(t).__name__, getattr(t.format_tools, "tool_format",
            None))]


built = {"version": llamafactory.__version__, "jobs": {},
         "templates": {name: type(t.mm_plugin).__name__ for name, t in TEMPLATES.items()},
         "text_turns": {name: text_turns(t) for name, t in TEMPLATES.items()}}
for index, job in enumerate(jobs):
    if job["template"] not in TEMPLATES:
        continue
    args = dict(stage=job["stage"], model_name_or_path=model, do_train=True, dataset=job["dataset"],
                dataset_dir=job["dataset_dir"], template=job["template"], cutoff_len=cutoff, output_dir=out + "/o",
                overwrite_cache=True, finetuning_type="lora", report_to="none", **job["keys"])
    model_args, data_args, training_args, _, _ = get_train_args(args)
    tokenizer_module = load_tokenizer(model_args)  # a fresh one: the template changes it in place
    fixed = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
    fixed.mm_plugin = get_mm_plugin(name="base")  # image plugins need a processor; text passes them unchanged
    module = get_dataset(fixed, model_args, data_args, training_args, job["stage"], **tokenizer_module)
    path = f"{out}/job-{index}"
    module["train_dataset"].save_to_disk(path)
    built["jobs"][str(index)] = path
print(json.dumps(built))
"""


def llamafactory_encodings(python: str, work: Path, model: str, jobs: list[dict]) -> dict:
    """{job index: LLaMA-Factory's encoded rows}, and its version; jobs with a template it lacks are absent."""
    from datasets import load_from_disk

    out = work / "llamafactory-parity"
    done = subprocess.run([python, "-c", LLAMAFACTORY_PARITY, model, str(out), json.dumps(jobs), str(CUTOFF)],
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"LLaMA-Factory failed:\n{done.stderr[-4000:]}")
    built = json.loads(done.stdout.strip().splitlines()[-1])
    return {"version": built["version"], "templates": built["templates"], "text_turns": built["text_turns"],
            "jobs": {int(i): load_from_disk(p) for i, p in built["jobs"].items()}}


def build_ours(work: Path, model: str, job: dict, data: Path):
    """tuneline's encoding of one job, built through the build-dataset step."""
    from tuneline.data import build_dataset, load_processed

    config = BENCH.make_config(work, model, 1, job["template"], stage=job["stage"], dataset=job["dataset"],
                               dataset_dir=str(data), cutoff_len=CUTOFF, pipeline_cache_dir=str(work / "cache"),
                               **job["keys"])
    return load_processed(build_dataset(config))["train"]


def compare_job(work: Path, model: str, job: dict, theirs: list[dict], rows: dict | None = None) -> str | None:
    """None when tuneline's rows are LLaMA-Factory's (`theirs`), else where they first differ."""
    data = write_job_data(work / "job-data", job["dataset"], rows)
    ours = build_ours(work, model, job, data)
    if len(ours) != len(theirs):
        return f"{len(ours)} rows against {len(theirs)}"
    for column in [c for c in theirs[0] if c.endswith(("input_ids", "labels"))] if theirs else []:
        for row, (a, b) in enumerate(zip(ours[column], (t[column] for t in theirs), strict=True)):
            if list(a) != list(b):
                return f"row {row} {column}"
    return None


def template_parity(python: str, work: Path, model: str, snapshot: bool, snapshot_rows_only: bool = False) -> None:
    """Per template: identical, or the first job that differs; then the count of identical templates.
    `snapshot_rows_only`: the demo jobs encode only the rows the snapshot keeps (minutes instead of most of an hour)."""
    from datasets import disable_progress_bars

    from tuneline.data.template_catalog import TEMPLATES

    disable_progress_bars()
    jobs = parity_jobs(TEMPLATES)
    for job in jobs:
        rows = snapshot_rows(job) if snapshot_rows_only else None
        job["dataset_dir"] = str(write_job_data(work / "parity-data" / job["dataset"].replace(",", "-"),
                                                job["dataset"], rows))
        job["cut"] = rows is not None
    built = llamafactory_encodings(python, work, model, jobs)
    problems: dict[str, list[str]] = {}
    for index, theirs in built["jobs"].items():
        rows = snapshot_rows(jobs[index]) if jobs[index]["cut"] else None
        difference = compare_job(work, model, jobs[index], theirs.to_list(), rows)
        problems.setdefault(jobs[index]["template"], []).extend([f"{job_name(jobs[index])}: {difference}"]
                                                               if difference else [])
    for name, found in problems.items():
        print(f"{name}: {'identical' if not found else 'differs (' + '; '.join(found) + ')'}")
    identical = sum(not found for found in problems.values())
    demo = "the snapshot's demo rows" if snapshot_rows_only else "the demo data"
    print(f"{identical} of {len(problems)} templates identical on LLaMA-Factory {built['version']}'s encoding of "
          f"{demo} and, for reasoning templates, of the thinking rows under each thinking setting; not in "
          f"LLaMA-Factory: {', '.join(sorted(set(TEMPLATES) - set(problems))) or 'none'}")
    if snapshot:
        write_snapshot(jobs, built)


def snapshot_rows(job: dict) -> dict[str, list[int]] | None:
    """The rows of a job the snapshot keeps: a few of each kind for the demo data, all thinking rows (None)."""
    if job["dataset"].startswith("thinking_"):
        return None
    return {name: demo_rows(name) for name in job["dataset"].split(",")}


def position_of(job: dict, rows: dict[str, list[int]] | None) -> list[int] | None:
    """The kept rows' places in the job's whole encoding (its datasets one after another)."""
    if rows is None:
        return None
    places, start = [], 0
    for name in job["dataset"].split(","):
        places += [start + i for i in rows[name]]
        start += len(json.loads((DEMO_DATA / f"{name}.json").read_text()))
    return places


def encoded_rows(theirs, places: list[int] | None) -> list[dict]:
    """LLaMA-Factory's rows as compact JSON: ids per column, labels as runs against their input ids."""
    picked = theirs if places is None else theirs.select(places)
    out = []
    for row in picked:
        compact = {}
        for column in row:
            if column.endswith("input_ids"):
                compact[column] = list(row[column])
            elif column.endswith("labels"):
                ids = row[column.removesuffix("labels") + "input_ids"]
                compact[column] = BENCH.label_runs(ids, row[column])
        out.append(compact)
    return out


def write_snapshot(jobs: list[dict], built: dict) -> None:
    entries = []
    for index, theirs in built["jobs"].items():
        job = {k: v for k, v in jobs[index].items() if k not in ("dataset_dir", "cut")}
        rows = snapshot_rows(job)
        places = None if jobs[index]["cut"] else position_of(job, rows)  # a cut job holds those rows alone
        entries.append({**job, "rows": rows, "encoded": encoded_rows(theirs, places)})
    plain = "BasePlugin"  # LLaMA-Factory's plugin of its text templates
    snapshot = {"llamafactory": built["version"], "cutoff_len": CUTOFF,
                "text_templates": sorted(n for n, plugin in built["templates"].items() if plugin == plain),
                "multimodal_templates": sorted(n for n, plugin in built["templates"].items() if plugin != plain),
                "text_turns": built["text_turns"],
                "tokenizer": f"tests/fixtures/{BENCH.SNAPSHOT_TOKENIZER.name}",
                "command": "python benchmarks/data_throughput.py --template-parity --snapshot --snapshot-rows-only "
                           "--llamafactory-python .venv-peer/bin/python", "jobs": entries}
    text = json.dumps(snapshot, separators=(",", ":"), ensure_ascii=False).encode()
    SNAPSHOT.write_bytes(lzma.compress(text, preset=9 | lzma.PRESET_EXTREME))
    print(f"wrote {SNAPSHOT} ({SNAPSHOT.stat().st_size / 1e3:.0f} kB, {len(entries)} jobs)")


def read_snapshot() -> dict:
    return json.loads(lzma.decompress(SNAPSHOT.read_bytes()))


def snapshot_theirs(entry: dict) -> list[dict]:
    """A snapshot job's rows with full label lists, as `first_difference` reads them."""
    out = []
    for row in entry["encoded"]:
        full = {}
        for column, value in row.items():
            if column.endswith("labels"):
                full[column] = BENCH.labels_from_runs(row[column.removesuffix("labels") + "input_ids"], value)
            else:
                full[column] = value
        out.append(full)
    return out
