"""Tool rows encode as LLaMA-Factory 0.9.5 encodes them: input ids and labels, row by row, against a snapshot.

tests/fixtures/llamafactory/0.9.5/tool_parity.json.xz holds LLaMA-Factory's sft encoding of the first glaive tool
rows (en and zh) and of tests/fixtures/tool_rows.json, per job: every template both projects have on its own tool
format, and every tool format as a `tool_format` override on one template, llama3's date pinned (`tool_date`). It
was made with the tokenizer files in tests/fixtures/template_parity_tokenizer (kept, not rebuilt: the tiny tokenizer
is trained on data/, which may change) by `benchmarks/data_throughput.py --template-parity --snapshot`, which
without `--snapshot-rows-only` compares every glaive row too. Here tuneline's build-dataset step rebuilds each job, without LLaMA-Factory; the benchmark's helpers
write the data folders and find the first difference, so both sides read the rows alike.
"""

from __future__ import annotations

import pytest

from tests.support.mm_parity import load_parity_benchmark
from tuneline.data.template_catalog import TEMPLATES
from tuneline.data.tools import TOOL_FORMATS

NOT_IN_LLAMAFACTORY = {"baichuan2", "qwen2"}  # 0.9.5 no longer has them


BENCH = load_parity_benchmark("data_throughput")
JOB_NAMES = [BENCH.job_name(*job) for job in BENCH.tool_jobs(sorted(set(TEMPLATES) - NOT_IN_LLAMAFACTORY),
                                                               TOOL_FORMATS)]


@pytest.fixture(scope="module")
def snapshot() -> dict:
    return BENCH.read_snapshot()


@pytest.fixture(scope="module")
def snapshot_jobs(snapshot) -> dict[str, dict]:
    return {BENCH.job_name(job["template"], job["tool_format"]): job for job in snapshot["jobs"]}


@pytest.fixture(scope="module")
def snapshot_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(BENCH.SNAPSHOT_TOKENIZER)


def test_snapshot_covers_every_template_and_tool_format(snapshot, snapshot_jobs):
    """A template or tool format added on one side shows here, as a job the snapshot lacks: rerun the benchmark."""
    assert (snapshot["llamafactory"], snapshot["stage"]) == ("0.9.5", "sft")
    assert sorted(snapshot_jobs) == sorted(JOB_NAMES)
    assert all(job["rows"]["tool_rows"] and job["input_ids"] for job in snapshot_jobs.values())


@pytest.mark.parametrize("name", JOB_NAMES)
def test_tool_rows_encode_as_llamafactory(name, snapshot, snapshot_jobs, snapshot_tokenizer, make_config, tmp_path):
    job = snapshot_jobs.get(name) or pytest.fail(f"{name} is not in the snapshot: rerun {snapshot['command']}")
    data = BENCH.write_tool_data(tmp_path / "data", job["rows"])
    config = make_config(model_name_or_path=str(BENCH.SNAPSHOT_TOKENIZER), dataset=",".join(job["rows"]),
                         dataset_dir=str(data), template=job["template"], tool_format=job["tool_format"],
                         tool_date=snapshot["tool_date"], cutoff_len=snapshot["cutoff_len"], stage=snapshot["stage"])
    theirs = [{"input_ids": ids, "labels": BENCH.labels_from_runs(ids, runs)}
              for ids, runs in zip(job["input_ids"], job["labels"], strict=True)]
    difference = BENCH.compare_tool_job(snapshot_tokenizer, config, theirs, job["rows"])
    assert difference is None, f"{name}: {difference}"
