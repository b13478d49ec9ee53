"""MiniCPM-V 4.6: an image becomes a downscaled overview and, when it is larger than the slice resolution, a grid of
slices, each a run of image pads inside its own markers (`<image>...</image>`, then `<slice>...</slice>` per slice,
one line per grid row), the whole prefixed with the image's number in its row (`<image_id>0</image_id>`).

Counted from image sizes with the image processor's own public sizing rules (grid, overview and slice sizes), so a
dataset is expanded without decoding pixels; a pad stands for 16 vision patches (4 in the `4x` downsample mode).
As LLaMA-Factory 0.9.5's `minicpm_v_4_6` plugin, the images reach the image processor as they are: the pixel-limit
keys (`image_max_pixels`, `image_min_pixels`) do not apply, the processor's `scale_resolution` and
`max_slice_nums` size them. Videos are refused: that plugin counts no video frames (it reads image sizes only, which
a video's inputs do not hold), and transformers' MiniCPM-V video processor needs torchvision."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tuneline.data.media import IMAGE_PLACEHOLDER
from tuneline.data.mm.base_plugin import MMPlugin
from tuneline.data.mm.pixels import MediaSettings, open_image

# the processor's marker tokens, by the attribute names transformers' MiniCPMV4_6Processor (and its tokenizer) use;
# the values are LLaMA-Factory's fallbacks, MiniCPM's own marker strings
MARKERS = {"image_start_token": "<image>", "image_end_token": "</image>", "slice_start_token": "<slice>",
           "slice_end_token": "</slice>", "image_id_start_token": "<image_id>", "image_id_end_token": "</image_id>"}
# batch fields the image processor returns only to count tokens: transformers' processor drops them, the model
# never reads them (and the collator would take their per-image lists for per-token ones)
COUNT_ONLY_FIELDS = ("grids", "num_patches_per_image")
_EXIF_ORIENTATION = 0x0112
_TURNED = (5, 6, 7, 8)  # EXIF orientations that swap width and height once applied


@dataclass(frozen=True)
class MiniCPMV46Plugin(MMPlugin):
    """The image pads of each image as MiniCPM-V 4.6's processor writes them (see the module docstring)."""

    # why its videos are refused, for the refusals that name a reason: LLaMA-Factory 0.9.5's plugin reads a video's
    # frame count and sizes from keys its video inputs never hold (a video row fails there with a TypeError)
    unencoded_videos = ("reads no videos (LLaMA-Factory 0.9.5's minicpm_v_4_6 plugin fails on them: it looks for a "
                        "video's frames and sizes where its video inputs do not hold them)")

    def image_texts(self, images: list, processor: Any, settings: MediaSettings) -> list[str]:
        marks = {name: _processor_attribute(processor, name, default) for name, default in MARKERS.items()}
        pad = _processor_attribute(processor, "image_token", self.image_token)
        image_processor = processor.image_processor
        numbered = getattr(processor, "default_use_image_id", image_processor.use_image_id)
        texts = []
        for index, image in enumerate(images):
            overview, grid, per_slice = slice_layout(image_processor, *oriented_size(image))
            text = marks["image_start_token"] + pad * overview + marks["image_end_token"]
            if numbered:
                text = f"{marks['image_id_start_token']}{index}{marks['image_id_end_token']}" + text
            if grid and getattr(processor, "slice_mode", True):
                one = marks["slice_start_token"] + pad * per_slice + marks["slice_end_token"]
                text += "\n".join([one * grid[1]] * grid[0])
            texts.append(text)
        return texts

    def readable(self, text: str) -> str:
        """A decoded prompt with each image's whole text (its number, overview and slice grid) as one <image>."""
        pad, mark = re.escape(self.image_token), {name: re.escape(token) for name, token in MARKERS.items()}
        image = (f"(?:{mark['image_id_start_token']}\\d+{mark['image_id_end_token']})?"
                 f"{mark['image_start_token']}(?:{pad})*{mark['image_end_token']}"
                 f"(?:\n?{mark['slice_start_token']}(?:{pad})*{mark['slice_end_token']})*")
        return re.sub(image, IMAGE_PLACEHOLDER, text)

    def batch_inputs(self, images: list, videos: list, batch_ids: list[list[int]], processor: Any,
                     settings: MediaSettings = MediaSettings()) -> dict[str, Any]:
        """NaViT-packed pixels of all the batch's images (`pixel_values`, one row), each view's patch grid
        (`target_sizes`) and the downsample mode the pads were counted with, as LLaMA-Factory hands the model."""
        from transformers.image_utils import load_image

        image_processor = processor.image_processor
        inputs = dict(image_processor([load_image(open_image(image)) for image in images], return_tensors="pt"))
        for field in COUNT_ONLY_FIELDS:
            inputs.pop(field, None)
        inputs["downsample_mode"] = image_processor.downsample_mode
        return inputs


def slice_layout(image_processor: Any, height: int, width: int) -> tuple[int, list[int] | None, int]:
    """(pads of the overview, [rows, columns] of the slice grid or None, pads of each slice) of a height x width
    image, by the image processor's own sizing: the overview is resized to about `scale_resolution` squared (grown
    only when the image is not sliced), each slice likewise, both to whole merged patches."""
    ip = image_processor
    divisor = 4 if ip.downsample_mode == "4x" else 16
    grid = ip.get_sliced_grid((height, width), ip.max_slice_nums, ip.scale_resolution) if ip.slice_mode else None
    overview = ip.find_best_resize((height, width), ip.scale_resolution, ip.patch_size, ip.downsample_mode,
                                   allow_upscale=grid is None)
    if grid is None:
        return _pads(overview, ip.patch_size, divisor), None, 0
    refined = ip.get_refine_size((height, width), grid, ip.scale_resolution, ip.patch_size, ip.downsample_mode,
                                 allow_upscale=True)
    one_slice = (refined[0] // grid[0], refined[1] // grid[1])
    return _pads(overview, ip.patch_size, divisor), list(grid), _pads(one_slice, ip.patch_size, divisor)


def oriented_size(image: Any) -> tuple[int, int]:
    """(height, width) of the image as transformers loads it: turned upright by its EXIF orientation."""
    opened = open_image(image)
    width, height = opened.size
    if opened.getexif().get(_EXIF_ORIENTATION) in _TURNED:
        width, height = height, width
    return height, width


def _pads(size: tuple[int, int], patch: int, divisor: int) -> int:
    return (size[0] // patch) * (size[1] // patch) // divisor


def _processor_attribute(processor: Any, name: str, default: str | None) -> str:
    """A token the processor names (transformers' MiniCPMV4_6Processor), else its tokenizer (the image-only
    processor, `tuneline.model.image_only_processor`), else MiniCPM's own string."""
    return (getattr(processor, name, None) or getattr(getattr(processor, "tokenizer", None), name, None)
            or default)
