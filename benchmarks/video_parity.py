"""Video parity with LLaMA-Factory 0.9.5:
`python benchmarks/video_parity.py --llamafactory-python /work/main/.venv-peer/bin/python [--snapshot]`.

For each video of LLaMA-Factory's `mllm_video_demo` and each setting of `video_fps`, `video_maxlen`,
`video_max_pixels` and `video_min_pixels`, both projects (PyAV on each side) give: the frame indices sampled, each
sampled frame's size and pixel digest after the plugin's own resizing (LLaMA-Factory's Qwen-VL `_regularize_videos`
against tuneline's `sample_video` + `video_frames`), the sampled frame rate, duration and frame positions that
Qwen2.5-VL's `second_per_grid_ts` and Qwen3-VL's timestamps are made from, the video grid (temporal, height, width
patches) and the row's text once `<video>` is expanded by the qwen2_vl and qwen3_vl plugins, with its token ids.
It prints, per family and setting, whether all of it is identical, then "N of M jobs identical".

What is compared is what runs without a video processor: transformers builds every video processor on torchvision,
which does not load beside either project's CPU torch. Both plugins count a video's tokens from its header and
the processor's size settings alone (LLaMA-Factory's `_get_qwen_video_grid_metadata`), so the processor here is a
plain object holding a Qwen2-VL PIL image processor as image and video processor (Qwen3-VL's with 16-pixel patches),
the tokenizer, and, for Qwen3-VL, `Qwen3VLProcessor._calculate_timestamps` (a function of its arguments alone). On
LLaMA-Factory's side, its qwen2_vl plugin imports `smart_resize` from the torchvision image processor's module; the
script points that module name at its PIL twin (transformers marks the two functions as copies) before the plugin
runs. The pixels a video processor makes from these frames, and training on them, stay unchecked here.

`--snapshot` writes LLaMA-Factory's results to tests/fixtures/llamafactory/0.9.5/video_parity.json.xz for
tests/integration/data/test_video_parity.py, which checks tuneline against it without LLaMA-Factory.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT = REPO / "tests" / "fixtures" / "llamafactory" / "0.9.5" / "video_parity.json.xz"
DEMO = REPO / "tests" / "fixtures" / "llamafactory-mm"  # mllm_video_demo.json and its videos, as LLaMA-Factory ships
FAMILIES = {  # family -> (LLaMA-Factory template, video processor patch size)
    "qwen2_vl": ("qwen2_vl", 14), "qwen3_vl": ("qwen3_vl", 16),
}
VIDEO_PIXELS = {"min_pixels": 64 * 64, "max_pixels": 32 * 32 * 256}  # the video processor's range (per clip for Qwen3)
SETTINGS = {  # LLaMA-Factory's processor attributes (model_args) per job; defaults first
    "defaults": {"video_fps": 2.0, "video_maxlen": 128, "video_max_pixels": 256 * 256, "video_min_pixels": 16 * 16},
    "few_frames": {"video_fps": 1.0, "video_maxlen": 5, "video_max_pixels": 128 * 128, "video_min_pixels": 16 * 16},
    "slow_small": {"video_fps": 0.3, "video_maxlen": 128, "video_max_pixels": 64 * 64, "video_min_pixels": 16 * 16},
    "dense_grow": {"video_fps": 3.0, "video_maxlen": 24, "video_max_pixels": 256 * 256,
                   "video_min_pixels": 400 * 400},
}


def build_processor(family: str, out: Path) -> Path:
    """A tiny processor folder: the parity tokenizer with Qwen's tokens (benchmarks/mm_parity.py) and, in `video/`,
    a Qwen2-VL PIL image processor standing for the family's video processor."""
    from transformers import Qwen2VLImageProcessorPil

    mm_parity().build_processor(family, out)
    video = Qwen2VLImageProcessorPil(patch_size=FAMILIES[family][1], **VIDEO_PIXELS)
    video.save_pretrained(out / "video")
    return out


def load_processor(family: str, folder: Path, settings: dict) -> object:
    """The processor as both plugins read it, LLaMA-Factory's settings set as attributes (its `patch_processor`)."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

    processor = SimpleNamespace(image_processor=Qwen2VLImageProcessorPil.from_pretrained(folder),
                                video_processor=Qwen2VLImageProcessorPil.from_pretrained(folder / "video"),
                                tokenizer=AutoTokenizer.from_pretrained(folder),
                                model_input_names=["input_ids", "pixel_values_videos", "video_grid_thw"])
    for key, value in settings.items():
        setattr(processor, key, value)
    return processor


def demo_rows() -> list[dict]:
    rows = json.loads((DEMO / "mllm_video_demo.json").read_text())
    return [{"messages": row["messages"], "video": str(DEMO / row["videos"][0])} for row in rows]


def mm_parity():
    """benchmarks/mm_parity.py, whose tokenizer, image digest and row encoding this script shares."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mm_parity", Path(__file__).with_name("mm_parity.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rounded(values) -> list[float]:
    return [round(float(value), 9) for value in values]


LLAMAFACTORY_SIDE = r"""
import functools, json, sys
sys.path.insert(0, sys.argv[1])
import transformers.models.qwen2_vl.image_processing_pil_qwen2_vl as pil_twin
sys.modules["transformers.models.qwen2_vl.image_processing_qwen2_vl"] = pil_twin  # its torchvision twin's name
import av
from pathlib import Path
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from video_parity import FAMILIES, SETTINGS, demo_rows, load_processor, mm_parity, rounded
from llamafactory.data.template import TEMPLATES

parity = mm_parity()
folders = json.loads(sys.argv[2])
results = {}
for family, (template, _) in FAMILIES.items():
    plugin = TEMPLATES[template].mm_plugin
    for setting, values in SETTINGS.items():
        processor = load_processor(family, Path(folders[family]), values)
        processor._calculate_timestamps = functools.partial(Qwen3VLProcessor._calculate_timestamps, None)
        limits = {"image_max_pixels": values["video_max_pixels"], "image_min_pixels": values["video_min_pixels"],
                  "video_fps": values["video_fps"], "video_maxlen": values["video_maxlen"]}
        rows = []
        for row in demo_rows():
            with av.open(row["video"], "r") as container:
                stream = next(s for s in container.streams if s.type == "video")
                indices = plugin._get_video_sample_indices(stream, **limits).tolist()
            regular = plugin._regularize_videos([row["video"]], **limits)
            grid = plugin._get_qwen_video_grid_metadata([row["video"]], processor)["video_grid_thw"].tolist()
            messages = plugin.process_messages(row["messages"], [], [row["video"]], [], processor)
            rows.append({"indices": indices, "frames": [parity.image_digest(f) for f in regular["videos"][0]],
                         "timing": {"fps": rounded(regular["fps_per_video"]), "duration": rounded(regular["durations"]),
                                    "positions": rounded(regular["frames_indices"][0])},
                         "grid": grid[0], "texts": [m["content"] for m in messages],
                         "ids": parity.encode_row(processor.tokenizer, messages)})
        results[f"{family}/{setting}"] = rows
print(json.dumps(results))
"""


def tuneline_side(folders: dict[str, Path]) -> dict[str, list[dict]]:
    """tuneline's results, shaped like LLaMA-Factory's."""
    from tuneline.data.mm import MediaSettings, get_mm_plugin
    from tuneline.data.mm.pixels import sample_video
    from tuneline.data.mm.plugins import frame_positions, sampled_fps

    parity = mm_parity()
    results = {}
    for family, (template, _) in FAMILIES.items():
        plugin = get_mm_plugin(template)
        for setting, values in SETTINGS.items():
            processor, settings = load_processor(family, folders[family], {}), MediaSettings(**values)
            rows = []
            for row in demo_rows():
                header = sample_video(row["video"], settings, decode=False)
                decoded = sample_video(row["video"], settings)
                messages = plugin.expand_messages(row["messages"], [], [row["video"]], processor, settings)
                rows.append({"indices": header.indices,
                             "frames": [parity.image_digest(f) for f in plugin.video_frames(decoded, settings)],
                             "timing": {"fps": rounded([sampled_fps(decoded, settings)]),
                                        "duration": rounded([decoded.duration]),
                                        "positions": rounded(frame_positions(decoded, settings))},
                             "grid": list(plugin.video_grid(header, processor, settings)),
                             "texts": [m["content"] for m in messages],
                             "ids": parity.encode_row(processor.tokenizer, messages)})
            results[f"{family}/{setting}"] = rows
    return results


def first_difference(ours: list[dict], theirs: list[dict]) -> str | None:
    """Where the two first differ: row (from 1) and field."""
    for number, (mine, other) in enumerate(zip(ours, theirs, strict=True), start=1):
        for field in ("indices", "frames", "timing", "grid", "texts", "ids"):
            if mine[field] != other[field]:
                return f"row {number}: {field} differ"
    return None


def main() -> None:
    parity = mm_parity()
    args = parity.parity_args(__doc__.splitlines()[0], SNAPSHOT)
    theirs, ours = parity.both_sides(args.llamafactory_python, LLAMAFACTORY_SIDE, build_processor, FAMILIES,
                                     tuneline_side)
    identical = 0
    for job, rows in theirs.items():
        difference = first_difference(ours[job], rows)
        identical += difference is None
        frames = [len(row["indices"]) for row in rows]
        print(f"{job}: {difference or 'identical'} ({len(rows)} videos, {frames} frames sampled)")
    print(f"{identical} of {len(theirs)} family/setting jobs identical on mllm_video_demo")
    if args.snapshot:
        parity.write_snapshot(SNAPSHOT, theirs)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
