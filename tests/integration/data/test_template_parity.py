"""Every chat template encodes as LLaMA-Factory 0.9.5 encodes it: input ids and labels, row by row, against a snapshot.

tests/fixtures/llamafactory/0.9.5/template_parity.json.xz holds LLaMA-Factory's encoding, per template, of demo rows
for sft (one and several turns, with and without a system prompt) and rm (pairs, alpaca and sharegpt), and per
reasoning template of tests/fixtures/thinking_rows.json under each setting of `enable_thinking`,
`preserve_thinking` and `mask_history`. It was made with the tokenizer in tests/fixtures/template_parity_tokenizer
by `benchmarks/data_throughput.py --template-parity --snapshot`, which without `--snapshot-rows-only` compares every
demo row too. Here tuneline's
build-dataset step rebuilds each job without LLaMA-Factory. Tool rows are tests/integration/data/test_tool_parity.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.mm_parity import load_parity_benchmark
from tuneline.data.template_catalog import TEMPLATES

REPO = Path(__file__).resolve().parents[3]
NOT_IN_LLAMAFACTORY = {"baichuan2", "qwen2"}  # 0.9.5 no longer has them


BENCH = load_parity_benchmark("template_parity")
SHARED = {name: template for name, template in TEMPLATES.items() if name not in NOT_IN_LLAMAFACTORY}
JOB_NAMES = [BENCH.job_name(job) for job in BENCH.parity_jobs(SHARED)]


@pytest.fixture(scope="module")
def snapshot() -> dict:
    return BENCH.read_snapshot()


@pytest.fixture(scope="module")
def snapshot_jobs(snapshot) -> dict[str, dict]:
    return {BENCH.job_name(job): job for job in snapshot["jobs"]}


def test_snapshot_covers_every_template_and_thinking_setting(snapshot, snapshot_jobs):
    """A template added on one side shows here, as a job the snapshot lacks: rerun the benchmark."""
    assert snapshot["llamafactory"] == "0.9.5"
    assert sorted(snapshot_jobs) == sorted(JOB_NAMES)
    assert all(job["encoded"] for job in snapshot_jobs.values())
    thinking = [job for job in snapshot_jobs.values() if job["keys"]]
    assert {job["template"] for job in thinking} == {name for name, t in SHARED.items() if t.reasoning}
    qwen3 = [str(job["encoded"]) for job in snapshot_jobs.values()
             if job["template"] == "qwen3" and job["dataset"].startswith("thinking")]
    assert len(qwen3) == 9 and len(set(qwen3)) >= 7, "the thinking settings change what LLaMA-Factory encodes"


@pytest.mark.parametrize("name", sorted(SHARED))
def test_template_encodes_as_llamafactory(name, snapshot, snapshot_jobs, tmp_path):
    """The demo rows (plain, multi-turn, pairwise) and, for a reasoning template, the thinking rows under every
    thinking setting."""
    jobs = [job for job in snapshot_jobs.values() if job["template"] == name]
    assert jobs, f"{name} is not in the snapshot: rerun {snapshot['command']}"
    model = str(REPO / snapshot["tokenizer"])
    for job in jobs:
        theirs = BENCH.snapshot_theirs(job)
        difference = BENCH.compare_job(tmp_path, model, job, theirs, job["rows"])
        assert difference is None, f"{BENCH.job_name(job)}: {difference}"
