"""Vision-language plugins: a message's `<image>`/`<video>` placeholders become the model's own tokens, as many as its
vision tower yields for that image, and a batch's media become the tensors the model's forward takes.

Two calls for two moments: `expand_messages` when the dataset is built (it needs only the sizes the images will have,
read from file headers, never pixels) and `batch_inputs` in the collator (it makes the pixels, in DataLoader workers).
Both follow LLaMA-Factory 0.9.5's `mm_plugin.py`; `benchmarks/mm_parity.py` compares the two projects."""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any

from tuneline.data.mm.base_plugin import MMPlugin
from tuneline.data.mm.minicpm import MiniCPMV46Plugin
from tuneline.data.mm.mllama import MllamaPlugin
from tuneline.data.mm.paligemma import PaliGemmaPlugin
from tuneline.data.mm.pixels import (
    PAN_AND_SCAN,
    MediaSettings,
    SampledVideo,
    image_size,
    limited_size,
    pan_and_scan_crops,
    qwen_frame_size,
    regularize_image,
    sample_video,
)
from tuneline.data.mm.pixtral import PixtralPlugin
from tuneline.errors import ConfigError, DataError, did_you_mean

VISION_BOS, VISION_EOS = "<|vision_start|>", "<|vision_end|>"  # Qwen-VL's frame around an image's or video's pads


@dataclass(frozen=True)
class LlavaPlugin(MMPlugin):
    """LLaVA: one image token per vision-tower patch of the (fixed-size) processed image."""

    def image_texts(self, images: list, processor: Any, settings: MediaSettings) -> list[str]:
        height, width = _processed_size(processor.image_processor, images[0], settings)
        patch = processor.patch_size
        count = (height // patch) * (width // patch) + (processor.num_additional_image_tokens or 0)
        if processor.vision_feature_select_strategy == "default":  # the CLS feature is dropped
            count -= 1
        return [self.image_token * count] * len(images)


@dataclass(frozen=True)
class LlavaNextPlugin(MMPlugin):
    """LLaVA-NeXT (any resolution): an image becomes its base view's patches, then the patches of the grid
    resolution that fits it best with the padding cut away, one newline token per row of those."""

    def image_texts(self, images: list, processor: Any, settings: MediaSettings) -> list[str]:
        patch_height, patch_width = _processed_size(processor.image_processor, images[0], settings)
        texts = []
        for image in images:
            width, height = image_size(image, settings.image_max_pixels, settings.image_min_pixels)
            count = anyres_token_count(height, width, patch_height, patch_width, processor)
            if processor.vision_feature_select_strategy == "default":  # the CLS feature is dropped
                count -= 1
            texts.append(self.image_token * count)
        return texts


def anyres_token_count(height: int, width: int, patch_height: int, patch_width: int, processor: Any) -> int:
    """Image tokens of a (height, width) image for a LLaVA-NeXT processor before any feature is dropped: the base
    view's patches (plus the processor's extra ones), and the best grid resolution's patches that hold the image
    (the letterbox padding around it left out), with one newline per row. Counted here from sizes, as LLaVA-NeXT's
    processor counts them, so a dataset is expanded without decoding pixels."""
    from transformers.image_processing_utils import select_best_resolution

    best_height, best_width = select_best_resolution((height, width), processor.image_processor.image_grid_pinpoints)
    rows = patch_height // processor.patch_size * (best_height // patch_height)
    columns = patch_width // processor.patch_size * (best_width // patch_width)
    if width / height > columns / rows:  # wider than the grid: rows above and below are padding
        rows -= (rows - int(round(height * (columns / width), 7))) // 2 * 2
    else:
        columns -= (columns - int(round(width * (rows / height), 7))) // 2 * 2
    base = (patch_height // processor.patch_size) * (patch_width // processor.patch_size)
    return rows * columns + rows + base + (processor.num_additional_image_tokens or 0)


@dataclass(frozen=True)
class Gemma3Plugin(MMPlugin):
    """Gemma 3: a fixed run of `mm_tokens_per_image` soft tokens between begin/end-of-image, from the processor.
    With pan and scan, a wide or tall image is followed by its crops, each such a run, in LLaMA-Factory's words."""

    pans_and_scans = True

    def image_texts(self, images: list, processor: Any, settings: MediaSettings) -> list[str]:
        sequence = processor.full_image_sequence
        if not settings.image_do_pan_and_scan:
            return [sequence] * len(images)
        # LLaMA-Factory writes the sentence for every image, crops or not (transformers' processor only with crops)
        return [f"Here is the original image {sequence} and here are some crops to help you see better "
                + " ".join([sequence] * pan_and_scan_crops(*image_size(image, settings.image_max_pixels,
                                                                       settings.image_min_pixels)))
                for image in images]

    def image_options(self, settings: MediaSettings) -> dict[str, Any]:
        """LLaMA-Factory's fixed pan-and-scan settings: the pixels hold each image, then its crops."""
        return dict(PAN_AND_SCAN) if settings.image_do_pan_and_scan else {}

    def batch_inputs(self, images: list, videos: list, batch_ids: list[list[int]], processor: Any,
                     settings: MediaSettings = MediaSettings()) -> dict[str, Any]:
        """Adds `token_type_ids` (1 on image soft tokens, unpadded lists), which Gemma 3 needs for its bidirectional
        attention over an image's tokens."""
        inputs = super().batch_inputs(images, videos, batch_ids, processor, settings)
        inputs.pop("num_crops", None)
        # by the soft token's id: transformers 5.24's processor calls begin-of-image its `image_token_id`
        image_id = processor.tokenizer.convert_tokens_to_ids(self.image_token)
        inputs["token_type_ids"] = [[int(token == image_id) for token in ids] for ids in batch_ids]
        return inputs


@dataclass(frozen=True)
class Qwen2VLPlugin(MMPlugin):
    """Qwen2-VL and Qwen2.5-VL: an image becomes one pad token per merged block of its grid (the image is resized to
    whole 28-pixel blocks within the processor's pixel range); a video, one per block of its frame pairs."""

    qwen_sizes = True
    image_frame = (VISION_BOS, VISION_EOS)  # the words around an image's pads

    def image_texts(self, images: list, processor: Any, settings: MediaSettings) -> list[str]:
        image_processor = processor.image_processor
        texts = []
        for image in images:
            width, height = image_size(image, settings.image_max_pixels, settings.image_min_pixels, qwen=True)
            count = image_processor.get_number_of_image_patches(height, width) // image_processor.merge_size ** 2
            texts.append(self.image_frame[0] + self.image_token * count + self.image_frame[1])
        return texts

    def video_texts(self, videos: list, processor: Any, settings: MediaSettings) -> list[str]:
        merge = processor.image_processor.merge_size ** 2
        texts = []
        for video in videos:
            frames, height, width = self.video_grid(sample_video(video, settings, decode=False), processor, settings)
            texts.append(VISION_BOS + self.video_token * (frames * height * width // merge) + VISION_EOS)
        return texts

    def batch_inputs(self, images: list, videos: list, batch_ids: list[list[int]], processor: Any,
                     settings: MediaSettings = MediaSettings()) -> dict[str, Any]:
        """Adds `mm_token_type_ids` (1 on image pads, 2 on video pads; unpadded lists) where the processor returns
        them: transformers from 5.17 computes Qwen-VL's multimodal rotary positions from them, and refuses pixels
        without them."""
        inputs = super().batch_inputs(images, videos, batch_ids, processor, settings)
        if "mm_token_type_ids" in getattr(processor, "model_input_names", ()):
            tokens = {self.image_token: 1, **({self.video_token: 2} if self.video_token else {})}
            kinds = {processor.tokenizer.convert_tokens_to_ids(token): kind for token, kind in tokens.items()}
            inputs["mm_token_type_ids"] = [[kinds.get(token, 0) for token in ids] for ids in batch_ids]
        return inputs

    def video_grid(self, video: SampledVideo, processor: Any, settings: MediaSettings) -> tuple[int, int, int]:
        """(temporal, height, width) patches of a sampled video: frames come in pairs, each frame resized like an
        image under the video pixel limits and then to the video processor's pixel range."""
        config = _video_config(processor)
        width, height = limited_size(*video.size, settings.video_max_pixels, settings.video_min_pixels, qwen=True)
        frames = len(video.indices) + len(video.indices) % 2
        height, width = self.resize_frames(frames, height, width, config)
        return math.ceil(frames / config.temporal_patch_size), height // config.patch_size, width // config.patch_size

    def resize_frames(self, frames: int, height: int, width: int, config: Any) -> tuple[int, int]:
        """Each frame on its own within the video processor's pixel range; with `cap_pixels_per_frame` (a video
        processor setting of transformers 5.2x, which LLaMA-Factory 0.9.5 does not read) the range's top is also
        bounded by each frame's share of `max_video_tokens`, as the processor's resize bounds it."""
        factor, shortest, longest = config.patch_size * config.merge_size, *_pixel_range(config)
        if getattr(config, "cap_pixels_per_frame", None):
            clip = int(config.max_video_tokens * factor * factor * 0.9)
            longest = max(min(longest, clip * config.temporal_patch_size // frames), int(shortest * 1.05))
        return qwen_frame_size(height, width, factor, shortest, longest)

    def video_inputs(self, videos: list, processor: Any, settings: MediaSettings) -> dict[str, Any]:
        sampled = [sample_video(video, settings) for video in videos]
        inputs = dict(processor.video_processor(videos=[self.video_frames(v, settings) for v in sampled],
                                                return_tensors="pt"))
        if "second_per_grid_ts" in processor.model_input_names:  # Qwen2.5-VL's absolute time positions
            temporal = getattr(processor.image_processor, "temporal_patch_size", 2)
            inputs["second_per_grid_ts"] = [temporal / sampled_fps(v, settings) for v in sampled]
        return inputs

    def video_frames(self, video: SampledVideo, settings: MediaSettings) -> list:
        frames = video.frames + video.frames[-1:] * (len(video.frames) % 2)
        return [regularize_image(frame, settings.video_max_pixels, settings.video_min_pixels, qwen=True)
                for frame in frames]


@dataclass(frozen=True)
class Qwen3VLPlugin(Qwen2VLPlugin):
    """Qwen3-VL: images as Qwen2-VL; a video is written frame pair by frame pair, each with its time in seconds."""

    def video_texts(self, videos: list, processor: Any, settings: MediaSettings) -> list[str]:
        merge_size = _video_config(processor).merge_size
        texts = []
        for video in videos:
            sampled = sample_video(video, settings, decode=False)
            frames, height, width = self.video_grid(sampled, processor, settings)
            times = frame_times(frame_positions(sampled, settings), settings.video_fps, merge_size)
            pads = VISION_BOS + self.video_token * (height * width // merge_size ** 2) + VISION_EOS
            texts.append("".join(f"<{times[i]:.1f} seconds>{pads}" for i in range(frames)))
        return texts

    def resize_frames(self, frames: int, height: int, width: int, config: Any) -> tuple[int, int]:
        """Qwen3-VL bounds the pixels of the whole clip (frames rounded to temporal patches), not of one frame."""
        if frames < config.temporal_patch_size:
            raise DataError(f"a video needs at least {config.temporal_patch_size} frames for Qwen3-VL; one has {frames}")
        factor, shortest, longest = config.patch_size * config.merge_size, *_pixel_range(config)
        if getattr(config, "cap_pixels_per_frame", None):  # transformers 5.2x: each frame at most its token share
            per_frame = max(min(config.max_video_tokens * factor * factor, longest // frames), int(shortest * 1.05))
            longest = per_frame * frames
        return qwen_frame_size(height, width, factor, shortest, longest, frames, config.temporal_patch_size)

    def video_inputs(self, videos: list, processor: Any, settings: MediaSettings) -> dict[str, Any]:
        sampled = [sample_video(video, settings) for video in videos]
        frames = [self.video_frames(v, settings) for v in sampled]
        metadata = [{"fps": settings.video_fps, "duration": v.duration, "total_num_frames": len(f),
                     "frames_indices": frame_positions(v, settings)} for v, f in zip(sampled, frames, strict=True)]
        inputs = dict(processor.video_processor(videos=frames, video_metadata=metadata, fps=settings.video_fps,
                                                return_metadata=True, do_sample_frames=False))
        if "second_per_grid_ts" in processor.model_input_names:
            temporal = getattr(processor.image_processor, "temporal_patch_size", 2)
            inputs["second_per_grid_ts"] = [temporal / sampled_fps(v, settings) for v in sampled]
        return inputs


def frame_times(positions: list[float], fps: float, merge_size: int) -> list[float]:
    """Seconds of each temporal patch: the mean time of its first and last frame (Qwen3-VL's processor rule), the
    frame list padded with its last frame to whole patches."""
    positions = list(positions) + [positions[-1]] * (-len(positions) % merge_size)
    seconds = [position / fps for position in positions]
    return [(seconds[i] + seconds[i + merge_size - 1]) / 2 for i in range(0, len(seconds), merge_size)]


def frame_positions(video: SampledVideo, settings: MediaSettings) -> list[float]:
    """Frame positions in units of sampled frames at `video_fps`, as Qwen3-VL's timestamps read them."""
    if video.average_fps is None:
        return [float(i) for i in video.indices]
    return [index / video.average_fps * settings.video_fps for index in video.indices]


def sampled_fps(video: SampledVideo, settings: MediaSettings) -> float:
    if video.average_fps is None:
        return settings.video_fps
    return len(video.indices) / video.duration


def _pixel_range(config: Any) -> tuple[int, int]:
    return config.size["shortest_edge"], config.size["longest_edge"]


def _video_config(processor: Any) -> Any:
    """The processor that sizes video frames; LLaMA-Factory falls back to the image processor's settings."""
    return getattr(processor, "video_processor", None) or processor.image_processor


def _processed_size(image_processor: Any, image: Any, settings: MediaSettings) -> tuple[int, int]:
    """(height, width) of every processed image where the processor makes one fixed size (center crop, or a fixed
    resize); otherwise the first image is processed to see, as LLaMA-Factory reads the first image's pixels."""
    fixed = image_processor.crop_size if getattr(image_processor, "do_center_crop", False) else image_processor.size
    height, width = (_size_field(fixed, "height"), _size_field(fixed, "width")) if fixed else (None, None)
    if height and width:
        return height, width
    regularized = regularize_image(image, settings.image_max_pixels, settings.image_min_pixels)
    return tuple(image_processor([regularized], return_tensors="pt")["pixel_values"].shape[-2:])


def _size_field(size: Any, key: str) -> int | None:
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)



PLUGINS: dict[str, MMPlugin] = {plugin.name: plugin for plugin in (
    MMPlugin(),
    LlavaPlugin("llava", image_token="<image>"),
    LlavaNextPlugin("llava_next", image_token="<image>"),
    Gemma3Plugin("gemma3", image_token="<image_soft_token>"),
    Qwen2VLPlugin("qwen2_vl", image_token="<|image_pad|>", video_token="<|video_pad|>"),
    Qwen3VLPlugin("qwen3_vl", image_token="<|image_pad|>", video_token="<|video_pad|>"),
    PixtralPlugin("pixtral", image_token="[IMG]"),
    PaliGemmaPlugin("paligemma", image_token="<image>"),
    MiniCPMV46Plugin("minicpm_v_4_6", image_token="<|image_pad|>"),
    MllamaPlugin("mllama", image_token="<|image|>"),
)}


# plugins that build on the classes above, kept in a family's own module: plugin name -> module, whose PLUGINS
# holds it (imported when named, as that module imports this one)
FAMILY_MODULES: dict[str, str] = {
    "intern_vl": "tuneline.data.mm.intern_vl",
    "glm4v": "tuneline.data.mm.glm4v",
}


def get_mm_plugin(name: str | None) -> MMPlugin:
    """The plugin a template names (`Template.mm_plugin`); None or 'base' for text-only models."""
    if name is None:
        return PLUGINS["base"]
    if name in FAMILY_MODULES:
        return importlib.import_module(FAMILY_MODULES[name]).PLUGINS[name]
    if name not in PLUGINS:
        known = {**PLUGINS, **FAMILY_MODULES}
        raise ConfigError(f"multimodal plugin '{name}' is not known{did_you_mean(name, known)}; "
                          f"use one of {sorted(known)}")
    return PLUGINS[name]
