"""The multimodal plugins expand and batch the mllm_demo rows as LLaMA-Factory 0.9.5 does, against a snapshot.

tests/fixtures/llamafactory/0.9.5/mm_parity.json.xz holds LLaMA-Factory's expanded texts, token ids, resized-image
digests and tensor summaries for llava, llava_next, gemma3, qwen2_vl and qwen3_vl under three pixel settings, written by
`benchmarks/mm_parity.py --snapshot` (which also compares live). Pixel values are compared to the benchmark's
`PROCESSOR_TOLERANCE`: transformers 5.24's Qwen2-VL image processor resizes a hair differently from 5.6's, which made
the snapshot; everything the plugins themselves compute (texts, ids, resized pixels, grids) must be identical.

Gemma 3's pan and scan is checked there too, on the plugin (`gemma3/pan_and_scan*`) and through the whole sft
encoding of the tiny gemma3 (the dataset's input ids and labels, the training collator's pixel values and token
types), with images that are cut into crops."""

from __future__ import annotations

import json
import lzma

import pytest

from tests.support.mm_parity import load_parity_benchmark

BENCH = load_parity_benchmark()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("mm-parity")
    folders = {family: BENCH.build_processor(family, work / family) for family in BENCH.FAMILIES}
    return BENCH.tuneline_side(folders)


def snapshot() -> dict:
    return json.loads(lzma.decompress(BENCH.SNAPSHOT.read_bytes()))


@pytest.mark.parametrize("job", [f"{family}/{setting}" for family, setting, _ in BENCH.jobs()])
def test_plugin_matches_llamafactory_snapshot(results, job):
    theirs = snapshot()[job]
    assert len(theirs) == len(BENCH.demo_rows(job.split("/")[1])) >= 3
    assert BENCH.first_difference(results[job], theirs, BENCH.PROCESSOR_TOLERANCE) is None


def test_pan_and_scan_encodes_and_batches_the_tiny_gemma3_as_llamafactory(tiny_vlm, tmp_path):
    theirs = snapshot()[BENCH.ENCODING_JOB]
    ours = BENCH.tuneline_encoding(tiny_vlm("gemma3"), tmp_path)
    images = [len(row["images"]) for row in BENCH.demo_rows()]
    crops = [row["inputs"]["pixel_values"]["shape"][0] - count for row, count in zip(ours["rows"], images, strict=True)]
    assert sum(crops) > 0 and 0 in crops  # wide images are cut into crops, the 300 x 199 one is not
    assert BENCH.encoding_difference(ours, theirs) is None
