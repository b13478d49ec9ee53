"""The multimodal plugins expand and batch the mllm_demo rows as LLaMA-Factory 0.9.5 does, against a snapshot.

tests/fixtures/llamafactory/0.9.5/mm_parity.json.xz holds LLaMA-Factory's expanded texts, token ids, resized-image
digests and tensor summaries for llava, llava_next, gemma3, qwen2_vl, qwen3_vl and mllama under three pixel settings,
written by `benchmarks/mm_parity.py --snapshot` (which also compares live). Pixel values are compared to the benchmark's
`PROCESSOR_TOLERANCE`: transformers 5.24's Qwen2-VL image processor resizes a hair differently from 5.6's, which made
the snapshot; everything the plugins themselves compute (texts, ids, resized pixels, grids) must be identical.

Gemma 3's pan and scan is checked there too, on the plugin (`gemma3/pan_and_scan*`) and through the whole sft
encoding of the tiny gemma3 (the dataset's input ids and labels, the training collator's pixel values and token
types), with images that are cut into crops. PaliGemma's whole sft encoding is checked the same way, its images
being placed on the token ids; and Llama 3.2 Vision's batches, on the tiny mllama: sft rows of one and two images
together, and rm pairs, with their tiles, aspect ratios and cross-attention masks."""

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
    theirs = snapshot()["tiny_gemma3/pan_and_scan_grow"]
    ours = BENCH.tuneline_encoding("tiny_gemma3/pan_and_scan_grow", tiny_vlm("gemma3"), tmp_path)
    images = [len(row["images"]) for row in BENCH.demo_rows()]
    crops = [row["inputs"]["pixel_values"]["shape"][0] - count for row, count in zip(ours["rows"], images, strict=True)]
    assert sum(crops) > 0 and 0 in crops  # wide images are cut into crops, the 300 x 199 one is not
    assert BENCH.encoding_difference(ours, theirs) is None


@pytest.mark.parametrize("job", ["tiny_paligemma/sft", "tiny_paligemma/cutoff_len_40"])
def test_paligemma_encodes_and_batches_its_images_on_the_token_ids_as_llamafactory(tiny_vlm, tmp_path, job):
    """PaliGemma's image tokens go on the ids before the beginning of sequence and count against cutoff_len first: the
    whole sft encoding (ids, labels, pixels, token types) as LLaMA-Factory's, whole and cut at 40 tokens."""
    theirs = snapshot()[job]
    ours = BENCH.tuneline_encoding(job, tiny_vlm("paligemma"), tmp_path)
    assert BENCH.encoding_difference(ours, theirs) is None
    images = [len(row["images"]) for row in BENCH.demo_rows()]
    assert [row["inputs"]["token_type_ids"]["shape"][1] - row["inputs"]["token_type_ids"]["sum"]
            for row in ours["rows"]] == [16 * count for count in images]


@pytest.mark.parametrize("job", ["tiny_mllama/sft_batches", "tiny_mllama/rm_pairs"])
def test_mllama_encodes_and_batches_as_llamafactory(tiny_vlm, tmp_path, job):
    ours = BENCH.tuneline_encoding(job, tiny_vlm("mllama"), tmp_path)
    masks = [row["inputs"]["cross_attention_mask"]["shape"] for row in ours["rows"] if "inputs" in row]
    assert len(masks) == 2 and all(shape[1] % 8 == 0 for shape in masks)  # two batches, padded to a multiple of 8
    assert BENCH.encoding_difference(ours, snapshot()[job]) is None
