"""Images and videos as a vision-language model's processor takes them, after LLaMA-Factory's pixel limits.

Sizes are computed apart from pixels (`limited_size`), so the number of image tokens is known when a dataset is
built, and the pixels themselves are made later (`regularize_image`, in a collator) through the same resize steps:
LLaMA-Factory resizes in up to five steps, and the same steps give the same pixels."""

from __future__ import annotations

import math
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

QWEN_MIN_SIDE = 28  # Qwen-VL's vision tower needs a 28-pixel side (one merged 2x2 block of 14-pixel patches)
QWEN_MAX_RATIO, QWEN_CUT_RATIO = 200, 180  # past 200:1 the long side is cut to 180 times the short one


@dataclass(frozen=True)
class MediaSettings:
    """LLaMA-Factory's keys and defaults: big images are scaled down (memory), tiny ones up (the vision tower needs
    whole patches); videos are sampled at `video_fps`, at most `video_maxlen` frames, each frame kept smaller."""

    image_max_pixels: int = 768 * 768
    image_min_pixels: int = 32 * 32
    video_max_pixels: int = 256 * 256
    video_min_pixels: int = 16 * 16
    video_fps: float = 2.0
    video_maxlen: int = 128
    image_do_pan_and_scan: bool = False  # Gemma 3 only: crops of a wide or tall image follow it
    crop_to_patches: bool = False  # InternVL only: an image is tiled, the tiles and a thumbnail each encoded


# The pan-and-scan settings LLaMA-Factory 0.9.5 hands Gemma 3's image processor, whatever the processor's own say.
PAN_AND_SCAN = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 256, "pan_and_scan_max_num_crops": 4,
                "pan_and_scan_min_ratio_to_activate": 1.2}


def limited_size(width: int, height: int, max_pixels: int, min_pixels: int, qwen: bool = False) -> tuple[int, int]:
    """(width, height) once the pixel limits (and, for Qwen-VL, its side and ratio limits) are applied."""
    sizes = [step for step in resize_steps(width, height, max_pixels, min_pixels, qwen) if step is not None]
    return sizes[-1] if sizes else (width, height)


def resize_steps(width: int, height: int, max_pixels: int, min_pixels: int, qwen: bool = False) -> list:
    """Each (width, height) LLaMA-Factory resizes to, in order; steps after the first `None` come after the RGB
    conversion (Qwen-VL's own limits), and the `None` is left out when no such step follows."""
    steps: list = []
    if width * height > max_pixels:
        factor = math.sqrt(max_pixels / (width * height))
        width, height = int(width * factor), int(height * factor)
        steps.append((width, height))
    if width * height < min_pixels:
        factor = math.sqrt(min_pixels / (width * height))
        width, height = int(width * factor), int(height * factor)
        steps.append((width, height))
    if not qwen:
        return steps
    steps.append(None)
    if min(width, height) < QWEN_MIN_SIDE:
        width, height = max(width, QWEN_MIN_SIDE), max(height, QWEN_MIN_SIDE)
        steps.append((width, height))
    if width / height > QWEN_MAX_RATIO:
        width = height * QWEN_CUT_RATIO
        steps.append((width, height))
    if height / width > QWEN_MAX_RATIO:
        height = width * QWEN_CUT_RATIO
        steps.append((width, height))
    return steps if steps[-1] is not None else steps[:-1]


def qwen_frame_size(height: int, width: int, factor: int, min_pixels: int, max_pixels: int, frames: int = 1,
                    temporal: int = 1) -> tuple[int, int]:
    """(height, width) a Qwen-VL processor resizes a frame to: whole `factor`-pixel blocks, as near the frame's shape
    as can be, with the clip's pixels (frames rounded to `temporal` patches) within [min_pixels, max_pixels]; one
    frame alone is an image. Written here because transformers keeps the video rule where torchvision is imported."""
    if min(height, width) < factor:  # too small for one block: scaled up to one
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    blocks_h, blocks_w = round(height / factor), round(width / factor)
    pixels = round(frames / temporal) * temporal * blocks_h * blocks_w * factor * factor
    if pixels > max_pixels:
        shrink = math.sqrt(frames * height * width / max_pixels)
        blocks_h, blocks_w = (max(1, math.floor(side / shrink / factor)) for side in (height, width))
    elif pixels < min_pixels:
        grow = math.sqrt(min_pixels / (frames * height * width))
        blocks_h, blocks_w = (math.ceil(side * grow / factor) for side in (height, width))
    return blocks_h * factor, blocks_w * factor


def pan_and_scan_crops(width: int, height: int) -> int:
    """How many crops Gemma 3's image processor cuts an image of this size into under `PAN_AND_SCAN` (0: none):
    along its long side, about one per aspect ratio, 2 to 4 of them, each at least 256 pixels on both sides.
    Written here because transformers counts them only by cutting the pixels; a test pins it to transformers."""
    ratio_to_activate, min_crop = PAN_AND_SCAN["pan_and_scan_min_ratio_to_activate"], PAN_AND_SCAN[
        "pan_and_scan_min_crop_size"]
    long, short = max(width, height), min(width, height)
    if long / short < ratio_to_activate:
        return 0
    crops = min(math.floor(long / short + 0.5), math.floor(long / min_crop))
    crops = min(PAN_AND_SCAN["pan_and_scan_max_num_crops"], max(2, crops))
    return crops if min(math.ceil(long / crops), short) >= min_crop else 0


def open_image(image: Any):
    """A PIL image from a path, bytes, a file object, `{"path", "bytes"}` (datasets' Image column) or a PIL image.
    PIL reads only the header here: the size is known without decoding the pixels."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image
    if isinstance(image, dict):
        image = image["path"] if image.get("bytes") is None else image["bytes"]
    if isinstance(image, bytes):
        image = BytesIO(image)
    if isinstance(image, (str, Path)) or hasattr(image, "read"):
        return Image.open(image)
    raise TypeError(f"an image must be a path, bytes or a PIL image, not {type(image).__name__}")


def image_size(image: Any, max_pixels: int, min_pixels: int, qwen: bool = False) -> tuple[int, int]:
    """(width, height) the image will have in the batch, read from its header."""
    opened = open_image(image)
    return limited_size(opened.width, opened.height, max_pixels, min_pixels, qwen)


def regularize_image(image: Any, max_pixels: int, min_pixels: int, qwen: bool = False):
    """The RGB image at `image_size`, resized step by step as LLaMA-Factory does."""
    image = open_image(image)
    converted = False
    for step in resize_steps(image.width, image.height, max_pixels, min_pixels, qwen):
        if step is None:
            image, converted = _rgb(image), True
        else:
            image = image.resize(step)
    return image if converted else _rgb(image)


def _rgb(image):
    return image if image.mode == "RGB" else image.convert("RGB")


@dataclass(frozen=True)
class SampledVideo:
    """The frames kept from a video: their images or paths (none when not decoded), their indices in the source,
    the source's frame size (width, height) and rate (None for a list of frames) and its duration in seconds."""

    frames: list
    indices: list[int]
    size: tuple[int, int]
    average_fps: float | None
    duration: float


def sample_indices(total_frames: int, duration: float, fps: float, maxlen: int) -> list[int]:
    """Frames kept: `fps` per second, at most `maxlen`, spread evenly (a stream of unknown length: `maxlen`)."""
    import numpy as np

    if total_frames == 0:
        return np.linspace(0, maxlen - 1, maxlen).astype(np.int32).tolist()
    count = min(total_frames, maxlen, max(1, math.floor(duration * fps)))
    return np.linspace(0, total_frames - 1, count).astype(np.int32).tolist()


def sample_video(video: Any, settings: MediaSettings, decode: bool = True) -> SampledVideo:
    """A video file read with PyAV, or a list of frames taken as sampled. Frames are decoded when `decode`, or when
    the header gives no frame count: LLaMA-Factory then samples the first `video_maxlen` frames, and only decoding
    tells how many of those exist, which the token count must know as the collator's pixels will."""
    if isinstance(video, (list, tuple)):
        first = open_image(video[0])
        return SampledVideo(list(video), list(range(len(video))), first.size, None, len(video) / settings.video_fps)
    import av

    with av.open(str(video) if isinstance(video, Path) else video, "r") as container:
        stream = next(s for s in container.streams if s.type == "video")
        fps = float(stream.average_rate) if stream.average_rate else None
        duration = _duration(stream, fps)
        indices = sample_indices(stream.frames, duration or 0.0, settings.video_fps, settings.video_maxlen)
        frames = []
        if decode or not stream.frames:
            indices, frames = _decode_frames(container, stream, indices, decode)
    if duration is None:
        duration = len(indices) / settings.video_fps
    return SampledVideo(frames, indices, (stream.width, stream.height), fps, duration)


def _duration(stream, fps: float | None) -> float | None:
    """Seconds of a stream: its header's duration; without one (LLaMA-Factory fails there), its frame count at its
    average rate; None for a stream of unknown length."""
    if stream.duration is not None:
        return float(stream.duration * stream.time_base)
    return stream.frames / fps if stream.frames and fps else None


def _decode_frames(container, stream, indices: list[int], keep_images: bool) -> tuple[list[int], list]:
    """The indices among `indices` that the stream has, and their images (when `keep_images`); decoding stops
    after the last one."""
    wanted, last = set(indices), indices[-1]
    found, images = [], []
    container.seek(0)
    for index, frame in enumerate(container.decode(stream)):
        if index in wanted:
            found.append(index)
            if keep_images:
                images.append(frame.to_image())
        if index >= last:
            break
    return found, images
