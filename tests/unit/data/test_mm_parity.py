"""The multimodal plugins expand and batch the mllm_demo rows as LLaMA-Factory 0.9.5 does, against a snapshot.

tests/fixtures/llamafactory/0.9.5/mm_parity.json.xz holds LLaMA-Factory's expanded texts, token ids, resized-image
digests and tensor summaries for llava, gemma3, qwen2_vl and qwen3_vl under three pixel settings, written by
`benchmarks/mm_parity.py --snapshot` (which also compares live). Pixel values are compared to the benchmark's
`PROCESSOR_TOLERANCE`: transformers 5.24's Qwen2-VL image processor resizes a hair differently from 5.6's, which made
the snapshot; everything the plugins themselves compute (texts, ids, resized pixels, grids) must be identical."""

from __future__ import annotations

import json
import lzma

import pytest
from mm_fixtures import load_parity_benchmark

BENCH = load_parity_benchmark()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("mm-parity")
    folders = {family: BENCH.build_processor(family, work / family) for family in BENCH.FAMILIES}
    return BENCH.tuneline_side(folders)


@pytest.mark.parametrize("job", [f"{family}/{setting}" for family in BENCH.FAMILIES for setting in BENCH.SETTINGS])
def test_plugin_matches_llamafactory_snapshot(results, job):
    snapshot = json.loads(lzma.decompress(BENCH.SNAPSHOT.read_bytes()))
    assert len(snapshot[job]) == 6
    assert BENCH.first_difference(results[job], snapshot[job], BENCH.PROCESSOR_TOLERANCE) is None
