"""Multimodal plugin parity with LLaMA-Factory 0.9.5:
`python benchmarks/mm_parity.py --llamafactory-python /work/main/.venv-peer/bin/python [--snapshot]`.

Builds a tiny processor per family offline (tests/fixtures/parity_tokenizer with the family's special tokens, and a
small image processor config: CLIP for llava, LLaVA-NeXT's any-resolution one, Gemma 3's, Qwen2-VL's, Pixtral's,
PaliGemma's SigLIP one, Mllama's tiles), saves each to a folder both environments load, and runs LLaMA-Factory's
plugin (`process_messages`, `process_token_ids`, `get_mm_inputs`) there and tuneline's (`expand_messages`,
`add_media_ids`, `batch_inputs`) here on every `mllm_demo` row, under three pixel settings (the defaults, a
`image_max_pixels` that shrinks the images, an `image_min_pixels` that grows them). It prints, per family and
setting, whether the expanded texts, their token ids and the tensors (shapes and values) are identical, then
"N of M jobs identical".

MiniCPM-V 4.6 (sliced at a 112-pixel resolution, so the demo images get slices) is compared as it downsamples 16x with
image ids and 4x without: transformers 5.6 has no MiniCPM-V 4.6 classes, so LLaMA-Factory's side replays the image
processor's outputs made here (benchmarks/minicpm_parity_processor.py says how); the pixel limits do not apply to it
in either project, and each setting must give the same result.

Qwen2-VL/Qwen3-VL, GLM-4.1V and InternVL processors need a video processor, which needs torchvision: both sides get
the image processor (Qwen2-VL's; GLM-4.1V's; GotOcr2's, 56-pixel tiles, for InternVL) and the tokenizer alone, in a plain object where the
processor would be (the plugins only read attributes). InternVL is also compared with `crop_to_patches: true`
(`intern_vl/crop_to_patches*`), where each demo image becomes a grid of tiles and a thumbnail, and on
mllm_video_demo's videos (`intern_vl/videos*`: the frames sampled and resized, their expanded lines and their pixel
values; InternVL sends frames through the image processor, so this runs without torchvision).
PixtralProcessor needs torchvision too: both sides get its PIL image processor, the tokenizer and its settings so.
`--snapshot` writes LLaMA-Factory's results (texts, ids, tensor summaries) to tests/fixtures/llamafactory/0.9.5/
mm_parity.json.xz for tests/integration/data/test_mm_parity.py, which checks tuneline against it without LLaMA-Factory.

Gemma 3's pan and scan (`image_do_pan_and_scan: true`) is compared twice: as plugin jobs (`gemma3/pan_and_scan*`),
and through each project's whole sft encoding on the tiny gemma3 (`tuneline tiny-model --preset gemma3`): the
dataset's input ids and labels, and the collator's pixel values and token types per row (`ENCODING_JOBS`). Images are
first grown to `image_min_pixels` 400 x 400 there, so the wide demo images (not the 300 x 199 one) are cut into
crops. LLaMA-Factory 0.9.5 reads image i's crop count as `num_crops[0][i]` (one list per batch of images), and
transformers 5.6's Gemma 3 image processor returns one flat list, on which that fails (IndexError: pan and scan does
not run in LLaMA-Factory 0.9.5 as installed): its side gets `nest_crop_counts`, which hands the plugin the nesting
it indexes and leaves the pixels alone.

PaliGemma's images are placed on the token ids (before the beginning of sequence) and count against `cutoff_len`
first: its whole sft encoding on the tiny paligemma is compared too, whole and cut at 40 tokens (`ENCODING_JOBS`).
Llama 3.2 Vision's batches are compared the same way on the tiny mllama: mllm_demo's sft rows four to a batch (rows
of one and two images together) and rlhf_v's pairs two to a batch (LLaMA-Factory's pairwise collator stacks chosen
over rejected), padded to a multiple of 8: the ids, the tiles, their aspect ratios and the cross-attention mask.
"""

from __future__ import annotations

import argparse
import json
import lzma
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
TOKENIZER = FIXTURES / "parity_tokenizer"
SNAPSHOT = FIXTURES / "llamafactory" / "0.9.5" / "mm_parity.json.xz"
DEMO = FIXTURES / "llamafactory" / "0.9.5" / "data"  # mllm_demo.json and its images, as LLaMA-Factory ships them
MM_DATA = FIXTURES / "llamafactory-mm"  # LLaMA-Factory's rlhf_v pairs, with a dataset_info.json that names them
FAMILIES = {  # family -> LLaMA-Factory template whose plugin (and tokens) it uses
    "llava": "llava", "gemma3": "gemma3", "qwen2_vl": "qwen2_vl", "qwen3_vl": "qwen3_vl", "llava_next": "llava_next",
    "pixtral": "pixtral", "paligemma": "paligemma",
    "minicpm_v_4_6": "minicpm_v_4_6", "minicpm_v_4_6_4x": "minicpm_v_4_6",  # 16x with image ids; 4x without
    "mllama": "mllama",
    "intern_vl": "intern_vl", "glm4v": "glm4v",
}
# LLaVA-NeXT's any-resolution grids for 56-pixel tiles: wide, tall and square grids, so each demo image picks its own
LLAVA_NEXT_GRIDS = [[56, 112], [112, 56], [112, 112], [56, 168], [168, 56]]
SETTINGS = {  # LLaMA-Factory's processor attributes (model_args) per job; defaults first
    "defaults": {"image_max_pixels": 768 * 768, "image_min_pixels": 32 * 32},
    "shrink": {"image_max_pixels": 80 * 80, "image_min_pixels": 32 * 32},
    "grow": {"image_max_pixels": 768 * 768, "image_min_pixels": 400 * 400},
}
PAN_AND_SCAN_SETTINGS = {  # gemma3 only: the key is Gemma 3's
    "pan_and_scan": {**SETTINGS["defaults"], "image_do_pan_and_scan": True},
    "pan_and_scan_grow": {**SETTINGS["grow"], "image_do_pan_and_scan": True},
}
PROCESSOR_TOLERANCE = 1e-3  # transformers 5.24's and 5.6's Qwen2-VL PIL processors resize to a hair's difference
QWEN_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
PIXTRAL = {"patch_size": 14, "spatial_merge_size": 1, "image_token": "[IMG]", "image_break_token": "[IMG_BREAK]",
           "image_end_token": "[IMG_END]"}  # PixtralProcessor's settings (processor_config.json)
CROP_TO_PATCHES_SETTINGS = {  # intern_vl only: the key is InternVL's
    "crop_to_patches": {**SETTINGS["defaults"], "crop_to_patches": True},
    "crop_to_patches_shrink": {**SETTINGS["shrink"], "crop_to_patches": True},
}
VIDEO_SETTINGS = {  # intern_vl only: its frames go through the image processor, so videos run without torchvision
    "videos": {**SETTINGS["defaults"], "video_fps": 2.0, "video_maxlen": 6, "video_max_pixels": 128 * 128,
               "video_min_pixels": 16 * 16},
    "videos_grow": {**SETTINGS["defaults"], "video_fps": 1.0, "video_maxlen": 3, "video_max_pixels": 256 * 256,
                    "video_min_pixels": 100 * 100},
}
VIDEO_DEMO = FIXTURES / "llamafactory-mm"  # mllm_video_demo.json and its videos, as LLaMA-Factory ships them
INTERN_VL_TOKENS = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
                    "video_token": "<video>"}
INTERN_VL_SEQ_LENGTH = 4  # context tokens per 56-pixel tile
GLM4V_TOKENS = ["<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>",
                "<|video|>"]
GLM4V_PIXELS = {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 128}  # per pair of frames: an image counts twice


def build_processor(family: str, out: Path) -> Path:
    """A tiny processor folder for `family`: the fixture tokenizer plus the family's tokens and image config."""
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessorPil,
        Gemma3ImageProcessorPil,
        Gemma3Processor,
        Glm4vImageProcessorPil,
        GotOcr2ImageProcessorPil,
        LlavaNextImageProcessorPil,
        LlavaNextProcessor,
        LlavaProcessor,
        MllamaImageProcessorPil,
        MllamaProcessor,
        PaliGemmaProcessor,
        PixtralImageProcessorPil,
        Qwen2VLImageProcessorPil,
        SiglipImageProcessorPil,
    )

    if family.startswith("minicpm"):
        return minicpm_processors().build(family, out, TOKENIZER, [row["images"] for row in demo_rows()])
    if family == "llava":
        tokenizer = AutoTokenizer.from_pretrained(TOKENIZER, extra_special_tokens={"image_token": "<image>"})
        image_processor = CLIPImageProcessorPil(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56})
        processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=14,
                                   vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                   image_token="<image>")
    elif family == "llava_next":
        tokenizer = AutoTokenizer.from_pretrained(TOKENIZER, extra_special_tokens={"image_token": "<image>"})
        image_processor = LlavaNextImageProcessorPil(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56},
                                                     image_grid_pinpoints=LLAVA_NEXT_GRIDS)
        processor = LlavaNextProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=14,
                                       vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                       image_token="<image>")
    elif family == "gemma3":
        tokenizer = AutoTokenizer.from_pretrained(TOKENIZER, extra_special_tokens={
            "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"})
        processor = Gemma3Processor(image_processor=Gemma3ImageProcessorPil(size={"height": 56, "width": 56}),
                                    tokenizer=tokenizer, image_seq_length=4)
    elif family == "paligemma":  # 56-pixel images in 14-pixel patches: 16 image tokens before each row
        tokenizer = AutoTokenizer.from_pretrained(TOKENIZER, extra_special_tokens={"image_token": "<image>"})
        image_processor = SiglipImageProcessorPil(size={"height": 56, "width": 56}, image_seq_length=16)
        processor = PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer)
    elif family == "pixtral":  # the image processor, the tokenizer and the settings: PixtralProcessor needs torchvision
        tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
        tokenizer.add_special_tokens({"additional_special_tokens": [value for key, value in PIXTRAL.items()
                                                                    if key.endswith("token")]})
        tokenizer.save_pretrained(out)
        processor = PixtralImageProcessorPil(size={"longest_edge": 112}, patch_size={"height": 14, "width": 14})
        (out / "processor_config.json").write_text(json.dumps({"processor_class": "PixtralProcessor", **PIXTRAL}))
    elif family == "mllama":  # 56-pixel tiles, up to 4 an image
        tokenizer = AutoTokenizer.from_pretrained(TOKENIZER, extra_special_tokens={"image_token": "<|image|>"})
        processor = MllamaProcessor(image_processor=MllamaImageProcessorPil(size={"height": 56, "width": 56},
                                                                            max_image_tiles=4), tokenizer=tokenizer)
    elif family == "glm4v":  # the image processor and tokenizer alone: GLM-4.1V's processor needs torchvision
        tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
        tokenizer.add_special_tokens({"additional_special_tokens": GLM4V_TOKENS})
        tokenizer.save_pretrained(out)
        processor = Glm4vImageProcessorPil(size=GLM4V_PIXELS)
    elif family == "intern_vl":  # the image processor and tokenizer alone: InternVL's processor needs torchvision
        AutoTokenizer.from_pretrained(TOKENIZER, extra_special_tokens=INTERN_VL_TOKENS).save_pretrained(out)
        processor = GotOcr2ImageProcessorPil(size={"height": 56, "width": 56})
    else:  # the image processor and tokenizer alone: a Qwen-VL processor needs torchvision
        processor = AutoTokenizer.from_pretrained(TOKENIZER)
        processor.add_special_tokens({"additional_special_tokens": QWEN_TOKENS})
        processor.save_pretrained(out)
        processor = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
    processor.save_pretrained(out)
    return out


def load_processor(family: str, folder: Path, settings: dict) -> object:
    """The processor as a plugin reads it; LLaMA-Factory's settings set as attributes, as its `patch_processor`
    does (tuneline's plugins take them as `MediaSettings` and ignore the attributes)."""
    from transformers import (
        AutoProcessor,
        AutoTokenizer,
        Glm4vImageProcessorPil,
        GotOcr2ImageProcessorPil,
        PixtralImageProcessorPil,
        Qwen2VLImageProcessorPil,
    )

    if family == "pixtral":  # its settings as attributes, as on PixtralProcessor
        processor = SimpleNamespace(image_processor=PixtralImageProcessorPil.from_pretrained(folder),
                                    tokenizer=AutoTokenizer.from_pretrained(folder), **PIXTRAL)
    elif family.startswith("minicpm"):
        processor = minicpm_processors().load(folder)
    elif family.startswith("qwen"):  # named: transformers 5.6's AutoImageProcessor refuses to load without torchvision
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(folder)
        processor = SimpleNamespace(image_processor=image_processor, video_processor=image_processor,
                                    tokenizer=AutoTokenizer.from_pretrained(folder),
                                    model_input_names=["input_ids", "pixel_values", "image_grid_thw"])
    elif family == "glm4v":
        image_processor = Glm4vImageProcessorPil.from_pretrained(folder)
        processor = SimpleNamespace(image_processor=image_processor, video_processor=image_processor,
                                    tokenizer=AutoTokenizer.from_pretrained(folder),
                                    model_input_names=["input_ids", "pixel_values", "image_grid_thw"])
    elif family == "intern_vl":
        processor = SimpleNamespace(image_processor=GotOcr2ImageProcessorPil.from_pretrained(folder),
                                    tokenizer=AutoTokenizer.from_pretrained(folder),
                                    image_seq_length=INTERN_VL_SEQ_LENGTH)
    else:
        processor = AutoProcessor.from_pretrained(folder)
    for key, value in settings.items():
        setattr(processor, key, value)
    return processor


def minicpm_processors():
    """benchmarks/minicpm_parity_processor.py: MiniCPM-V 4.6's processors, which transformers 5.6 lacks."""
    sys.path.insert(0, str(Path(__file__).parent))
    import minicpm_parity_processor

    return minicpm_parity_processor


def unread_fields(family: str) -> tuple[str, ...]:
    """LLaMA-Factory's batch fields that no model reads, left out of the comparison (MiniCPM-V 4.6's counts)."""
    return minicpm_processors().UNREAD_FIELDS if family.startswith("minicpm") else ()


def jobs() -> list[tuple[str, str, dict]]:
    """(family, setting, LLaMA-Factory's processor attributes) for each plugin job."""
    plain = [(family, setting, values) for family in FAMILIES for setting, values in SETTINGS.items()]
    return (plain + [("gemma3", setting, values) for setting, values in PAN_AND_SCAN_SETTINGS.items()]
            + [("intern_vl", setting, values) for setting, values in {**CROP_TO_PATCHES_SETTINGS,
                                                                      **VIDEO_SETTINGS}.items()])


def nest_crop_counts(processor) -> None:
    """LLaMA-Factory's side only: its Gemma 3 plugin indexes `num_crops[0][i]`, transformers 5.6 returns a flat
    list (see the module's docstring); the image processor's output gets the one extra level, nothing else."""
    base = type(processor.image_processor)

    class NestedCropCounts(base):
        def __call__(self, *args, **kwargs):
            out = super().__call__(*args, **kwargs)
            if "num_crops" in out:
                out["num_crops"] = [[int(count) for count in out["num_crops"]]]
            return out

    processor.image_processor.__class__ = NestedCropCounts


def demo_rows(setting: str = "defaults") -> list[dict]:
    """The rows a job runs on: mllm_demo's (images), or for a video setting mllm_video_demo's (videos)."""
    demo, name = (VIDEO_DEMO, "mllm_video_demo") if setting in VIDEO_SETTINGS else (DEMO, "mllm_demo")
    rows = json.loads((demo / f"{name}.json").read_text())
    return [{"messages": row["messages"], "images": [str(demo / image) for image in row.get("images", [])],
             "videos": [str(demo / video) for video in row.get("videos", [])]} for row in rows]


def summarize(value) -> dict | list:
    """A tensor as its shape, dtype, sum and first values (a list stays as it is): small enough for a fixture."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    flat = value.detach().double().flatten()
    return {"shape": list(value.shape), "dtype": str(value.dtype).replace("torch.", ""),
            "sum": round(float(flat.sum()), 4), "abs_sum": round(float(flat.abs().sum()), 4),
            "head": [round(float(x), 6) for x in flat[:8]]}


def image_digest(image) -> str:
    """`WIDTHxHEIGHT:md5` of an image's pixels after the plugin's own resizing, before the processor's."""
    import hashlib

    import numpy as np

    return f"{image.width}x{image.height}:{hashlib.md5(np.asarray(image).tobytes()).hexdigest()}"


def encode_row(tokenizer, messages: list[dict]) -> list[int]:
    """The row's ids: each expanded message's text tokenized alone, concatenated (no template: it is not compared)."""
    return [token for message in messages for token in tokenizer(message["content"], add_special_tokens=False)
            ["input_ids"]]


LLAMAFACTORY_SIDE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from mm_parity import (FAMILIES, demo_rows, encode_row, image_digest, jobs, load_processor, nest_crop_counts,
                       summarize, unread_fields)
from llamafactory.data.template import TEMPLATES

folders = json.loads(sys.argv[2])
results = {}
for family, setting, values in jobs():
    plugin = TEMPLATES[FAMILIES[family]].mm_plugin
    processor = load_processor(family, folders[family], values)
    if values.get("image_do_pan_and_scan"):
        nest_crop_counts(processor)
    rows = []
    for row in demo_rows(setting):
        images, videos = row["images"], row["videos"]
        messages = plugin.process_messages(row["messages"], images, videos, [], processor)
        ids = encode_row(processor.tokenizer, messages)
        ids, _ = plugin.process_token_ids(ids, None, images, videos, [], processor.tokenizer, processor)
        inputs = plugin.get_mm_inputs(images, videos, [], [len(images)], [len(videos)], [0], [ids], processor)
        inputs = {k: v for k, v in inputs.items() if k not in unread_fields(family)}
        limits = {k: v for k, v in values.items() if k.endswith("_pixels")}
        regularized = plugin._regularize_images(images, **limits)["images"]
        if videos:  # each frame as the plugin resized it
            regularized += [frame for video in plugin._regularize_videos(
                videos, image_max_pixels=values["video_max_pixels"], image_min_pixels=values["video_min_pixels"],
                video_fps=values["video_fps"], video_maxlen=values["video_maxlen"])["videos"] for frame in video]
        rows.append({"texts": [m["content"] for m in messages], "ids": ids,
                     "images": [image_digest(image) for image in regularized],
                     "inputs": {k: summarize(v) for k, v in sorted(inputs.items())}})
    results[f"{family}/{setting}"] = rows
print(json.dumps(results))
"""


def tuneline_side(folders: dict[str, Path]) -> dict[str, list[dict]]:
    """tuneline's results, shaped like LLaMA-Factory's."""
    from tuneline.data.mm import MediaSettings, get_mm_plugin
    from tuneline.data.mm.pixels import regularize_image, sample_video
    from tuneline.data.template_catalog import TEMPLATES

    results = {}
    for family, setting, values in jobs():
        plugin = get_mm_plugin(TEMPLATES[FAMILIES[family]].mm_plugin)
        processor, settings = load_processor(family, folders[family], {}), MediaSettings(**values)
        rows = []
        for row in demo_rows(setting):
            images, videos = row["images"], row["videos"]
            messages = plugin.expand_messages(row["messages"], images, videos, processor, settings)
            ids = encode_row(processor.tokenizer, messages)
            ids, _ = plugin.add_media_ids(ids, None, images, videos, processor)
            inputs = plugin.batch_inputs(images, videos, [ids], processor, settings)
            regularized = [regularize_image(image, settings.image_max_pixels, settings.image_min_pixels,
                                            plugin.qwen_sizes) for image in images]
            regularized += [regularize_image(frame, settings.video_max_pixels, settings.video_min_pixels)
                            for video in videos for frame in sample_video(video, settings).frames]
            rows.append({"texts": [m["content"] for m in messages], "ids": ids,
                         "images": [image_digest(image) for image in regularized],
                         "inputs": {k: summarize(v) for k, v in sorted(inputs.items())}})
        results[f"{family}/{setting}"] = rows
    return results


class EncodingJob(NamedTuple):
    """A whole encoding compared: a tiny preset's dataset built by each project's own path from the same YAML keys,
    then batched `batch_size` rows at a time by its training collator (`inputs`: the batch tensors compared)."""

    preset: str
    keys: dict
    inputs: tuple[str, ...]
    batch_size: int = 1
    pad_to_multiple_of: int | None = None


PALIGEMMA_KEYS = {"stage": "sft", "dataset": "mllm_demo", "dataset_dir": str(DEMO), "template": "paligemma",
                  "cutoff_len": 2048}
MLLAMA_KEYS = {"template": "mllama", "cutoff_len": 2048}
MLLAMA_INPUTS = ("input_ids", "pixel_values", "aspect_ratio_ids", "aspect_ratio_mask", "cross_attention_mask")
ENCODING_JOBS = {
    "tiny_gemma3/pan_and_scan_grow": EncodingJob(
        "gemma3", {"stage": "sft", "dataset": "mllm_demo", "dataset_dir": str(DEMO), "template": "gemma3",
                   "cutoff_len": 2048, **PAN_AND_SCAN_SETTINGS["pan_and_scan_grow"]}, ("pixel_values", "token_type_ids")),
    # rows of one and two images batched together, padded to a multiple of 8 (as LLaMA-Factory's sft and rm train)
    "tiny_mllama/sft_batches": EncodingJob(
        "mllama", {"stage": "sft", "dataset": "mllm_demo", "dataset_dir": str(DEMO), **MLLAMA_KEYS}, MLLAMA_INPUTS,
        batch_size=4, pad_to_multiple_of=8),
    "tiny_mllama/rm_pairs": EncodingJob(
        "mllama", {"stage": "rm", "dataset": "rlhf_v", "dataset_dir": str(MM_DATA), **MLLAMA_KEYS}, MLLAMA_INPUTS,
        batch_size=2, pad_to_multiple_of=8),
    # PaliGemma's images on the token ids, before the beginning of sequence, counted against cutoff_len first: whole,
    # and cut at 40 tokens (16 an image, then the turns)
    "tiny_paligemma/sft": EncodingJob("paligemma", PALIGEMMA_KEYS, ("pixel_values", "token_type_ids")),
    "tiny_paligemma/cutoff_len_40": EncodingJob("paligemma", {**PALIGEMMA_KEYS, "cutoff_len": 40},
                                                ("pixel_values", "token_type_ids")),
}

LLAMAFACTORY_ENCODING = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
job, model, out = sys.argv[2], sys.argv[3], sys.argv[4]
os.environ["HF_DATASETS_CACHE"] = out + "/hf-cache"
os.environ["DISABLE_VERSION_CHECK"] = "1"
from mm_parity import ENCODING_JOBS, encoded_rows, nest_crop_counts, vocab_digest
from llamafactory.data import (PairwiseDataCollatorWithPadding, SFTDataCollatorWith4DAttentionMask, get_dataset,
                               get_template_and_fix_tokenizer)
from llamafactory.hparams import get_train_args
from llamafactory.model import load_tokenizer

job = ENCODING_JOBS[job]
args = dict(model_name_or_path=model, do_train=True, output_dir=out + "/o", overwrite_cache=True,
            finetuning_type="lora", report_to="none", **job.keys)
model_args, data_args, training_args, _, _ = get_train_args(args)
tokenizer_module = load_tokenizer(model_args)
vocab = vocab_digest(tokenizer_module["tokenizer"])
if job.keys.get("image_do_pan_and_scan"):
    nest_crop_counts(tokenizer_module["processor"])
template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
stage = job.keys["stage"]
train = get_dataset(template, model_args, data_args, training_args, stage, **tokenizer_module)["train_dataset"]
kind = SFTDataCollatorWith4DAttentionMask if stage == "sft" else PairwiseDataCollatorWithPadding
collator = kind(template=template, label_pad_token_id=-100, pad_to_multiple_of=job.pad_to_multiple_of,
                **tokenizer_module)
print(json.dumps({"vocab": vocab, "rows": encoded_rows(job, [train[i] for i in range(len(train))], collator)}))
"""


def vocab_digest(tokenizer) -> str:
    """The tokenizer's vocabulary, as an md5: a tiny preset's is trained when it is built."""
    import hashlib

    return hashlib.md5(json.dumps(sorted(tokenizer.get_vocab().items())).encode()).hexdigest()


def encoded_rows(job: EncodingJob, rows: list[dict], collator) -> list[dict]:
    """Each dataset row's id and label columns; on the first row of each batch, the batch's `job.inputs`
    summarized. A pair's two sequences go through one forward: tuneline's are stacked as LLaMA-Factory's are."""
    import torch

    encoded = [{key: list(row[key]) for key in sorted(row) if key.endswith(("input_ids", "labels"))} for row in rows]
    for start in range(0, len(rows), job.batch_size):
        batch = collator(rows[start:start + job.batch_size])
        if "chosen_input_ids" in batch:
            batch = {**batch, **batch.pop("media_inputs"),
                     "input_ids": torch.cat([batch["chosen_input_ids"], batch["rejected_input_ids"]])}
        encoded[start]["inputs"] = {key: summarize(batch[key]) for key in job.inputs}
    return encoded


def tuneline_encoding(name: str, model: Path, work: Path) -> dict:
    """tuneline's side of an encoding job: the build-dataset step's rows and the training collator's batches."""
    from tuneline.config import load_config
    from tuneline.data import build_collator, build_dataset, load_processed
    from tuneline.data.mm.run_media import dataset_media
    from tuneline.model import load_tokenizer

    job = ENCODING_JOBS[name]
    config = load_config(overrides={"model_name_or_path": str(model), "output_dir": str(work / "out"),
                                    "pipeline_cache_dir": str(work / "cache"), **job.keys}, check_paths=False)
    train = load_processed(build_dataset(config))["train"]
    tokenizer = load_tokenizer(config.model)
    collator = build_collator(config.stage, tokenizer, job.pad_to_multiple_of,
                              media=dataset_media(config, tokenizer, [train]))
    return {"vocab": vocab_digest(tokenizer), "rows": encoded_rows(job, [train[i] for i in range(len(train))], collator)}


def encoding_difference(ours: dict, theirs: dict) -> str | None:
    """Where two encodings first differ (row from 1, column), or None."""
    if ours["vocab"] != theirs["vocab"]:
        return "the tiny preset's vocabulary differs from the snapshot's: rebuild it with --snapshot"
    if len(ours["rows"]) != len(theirs["rows"]):
        return f"{len(ours['rows'])} rows against {len(theirs['rows'])}"
    for number, (mine, other) in enumerate(zip(ours["rows"], theirs["rows"], strict=True), start=1):
        if sorted(mine) != sorted(other):
            return f"row {number}: columns {sorted(mine)} vs {sorted(other)}"
        for column in [key for key in mine if key != "inputs"]:
            if mine[column] != other[column]:
                return f"row {number}: {column} differ"
        for key, value in mine.get("inputs", {}).items():
            if not same_summary(value, other["inputs"][key]):
                return f"row {number}: {key} {value} vs {other['inputs'][key]}"
    return None


def first_difference(ours: list[dict], theirs: list[dict], tolerance: float = 1e-4) -> str | None:
    """Where the two first differ (row from 1, field), tensors compared by shape, dtype and values to `tolerance`."""
    for number, (mine, other) in enumerate(zip(ours, theirs, strict=True), start=1):
        for field in ("texts", "ids", "images"):
            if mine[field] != other[field]:
                return f"row {number}: {field} differ"
        if sorted(mine["inputs"]) != sorted(other["inputs"]):
            return f"row {number}: inputs {sorted(mine['inputs'])} vs {sorted(other['inputs'])}"
        for key, value in mine["inputs"].items():
            if not same_summary(value, other["inputs"][key], tolerance):
                return f"row {number}: {key} {value} vs {other['inputs'][key]}"
    return None


def same_summary(mine, other, tolerance: float = 1e-4) -> bool:
    if not isinstance(mine, dict):
        return mine == other
    if mine["shape"] != other["shape"] or mine["dtype"] != other["dtype"]:
        return False
    numbers = [(mine["sum"], other["sum"]), (mine["abs_sum"], other["abs_sum"]), *zip(mine["head"], other["head"], strict=True)]
    return all(abs(a - b) <= tolerance * max(1.0, abs(b)) for a, b in numbers)


def encodings(python: str, work: Path) -> tuple[dict, dict]:
    """LLaMA-Factory's and tuneline's encoding jobs, each preset built once."""
    from tuneline.demo.tiny_vlm import build_tiny_vlm

    theirs, ours = {}, {}
    for name, job in ENCODING_JOBS.items():
        model = work / f"tiny_{job.preset}"
        if not model.exists():
            build_tiny_vlm(model, job.preset)
        done = subprocess.run([python, "-c", LLAMAFACTORY_ENCODING, str(Path(__file__).parent), name, str(model),
                               str(work / "llamafactory" / name)], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"LLaMA-Factory's encoding {name} failed:\n{done.stderr[-4000:]}")
        theirs[name] = json.loads(done.stdout.strip().splitlines()[-1])
        ours[name] = tuneline_encoding(name, model, work / "tuneline" / name)
    return theirs, ours


def parity_args(description: str, snapshot: Path) -> argparse.Namespace:
    """The command line of a parity script: LLaMA-Factory's interpreter, and whether to write its snapshot."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--llamafactory-python", required=True, help="an interpreter where llamafactory 0.9.5 imports")
    parser.add_argument("--snapshot", action="store_true", help=f"write LLaMA-Factory's results to {snapshot}")
    return parser.parse_args()


def both_sides(llamafactory_python: str, side_code: str, build, families, ours) -> tuple[dict, dict]:
    """(LLaMA-Factory's results, tuneline's) on processor folders `build(family, folder)` makes for each family:
    `side_code` runs in LLaMA-Factory's interpreter with this folder and the folders as arguments, `ours` here."""
    with tempfile.TemporaryDirectory() as work:
        folders = {family: build(family, Path(work) / family) for family in families}
        done = subprocess.run([llamafactory_python, "-c", side_code, str(Path(__file__).parent),
                               json.dumps({k: str(v) for k, v in folders.items()})], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"LLaMA-Factory failed:\n{done.stderr[-4000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1]), ours(folders)


def write_snapshot(snapshot: Path, theirs: dict) -> None:
    snapshot.write_bytes(lzma.compress(json.dumps(theirs, separators=(",", ":")).encode()))
    print(f"wrote {snapshot} ({snapshot.stat().st_size} bytes)")


def main() -> None:
    args = parity_args(__doc__.splitlines()[0], SNAPSHOT)
    theirs, ours = both_sides(args.llamafactory_python, LLAMAFACTORY_SIDE, build_processor, FAMILIES, tuneline_side)
    with tempfile.TemporaryDirectory() as work:
        encoded = encodings(args.llamafactory_python, Path(work))
    theirs.update(encoded[0])
    ours.update(encoded[1])
    identical = close = 0
    for job, rows in theirs.items():
        if job in ENCODING_JOBS:
            difference = encoding_difference(ours[job], rows)
            identical += difference is None
            print(f"{job} (dataset ids and labels, batch {', '.join(ENCODING_JOBS[job].inputs)}): "
                  f"{difference or 'identical'} ({len(rows['rows'])} rows)")
            continue
        difference = first_difference(ours[job], rows)
        if difference and first_difference(ours[job], rows, PROCESSOR_TOLERANCE) is None:
            close += 1
            difference = (f"texts, ids and resized images identical; pixel values within {PROCESSOR_TOLERANCE} "
                          f"(the processor's own resize differs between the two transformers versions)")
        identical += difference is None
        print(f"{job}: {difference or 'identical'} ({len(rows)} rows)")
    print(f"{identical} of {len(theirs)} jobs identical on mllm_demo and mllm_video_demo, {close} more identical up to "
          "the image processor's transformers version")
    if args.snapshot:
        write_snapshot(SNAPSHOT, theirs)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
