"""Videos are sampled, resized, timed and expanded into Qwen-VL tokens as LLaMA-Factory 0.9.5 does, against a snapshot.

tests/fixtures/llamafactory/0.9.5/video_parity.json.xz holds LLaMA-Factory's sampled frame indices, resized-frame
digests, frame rates and positions, video grids and expanded texts with their ids, for each mllm_video_demo video
under four (video_fps, video_maxlen, video_max_pixels, video_min_pixels) settings and the qwen2_vl and qwen3_vl
plugins, written by `benchmarks/video_parity.py --snapshot` (which also compares live). All of it must be identical;
what a video processor makes of the frames needs torchvision and is not compared."""

from __future__ import annotations

import json
import lzma

import pytest

from tests.support.mm_parity import load_parity_benchmark

BENCH = load_parity_benchmark("video_parity")


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("video-parity")
    return BENCH.tuneline_side({family: BENCH.build_processor(family, work / family) for family in BENCH.FAMILIES})


@pytest.mark.parametrize("job", [f"{family}/{setting}" for family in BENCH.FAMILIES for setting in BENCH.SETTINGS])
def test_video_sampling_and_expansion_match_llamafactory_snapshot(results, job):
    snapshot = json.loads(lzma.decompress(BENCH.SNAPSHOT.read_bytes()))
    assert len(snapshot[job]) == 3
    assert BENCH.first_difference(results[job], snapshot[job]) is None
