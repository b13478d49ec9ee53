"""InternVL's plugin (InternVL 2.5 / 3 / 3.5 in transformers' format, and Intern-S1): an image is one 448-pixel
tile, or with `crop_to_patches` the grid of tiles nearest its shape plus a thumbnail, and each tile becomes
`image_seq_length` context tokens between `<img>` and `</img>`. A video is its sampled frames, one tile each, written
`Frame1: <img>...</img>` line by line.

Tiles are counted from the image's size by the image processor's own `get_number_of_image_patches`, so a dataset is
expanded without decoding pixels. As in LLaMA-Factory 0.9.5, a batch's pixel values hold all its images' tiles, then
all its videos' frames (images and videos interleaved in one row are not ordered otherwise), and the frames go
through the image processor: no video processor, so InternVL's videos need no torchvision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneline.data.mm.pixels import MediaSettings, image_size, regularize_image, sample_video
from tuneline.data.mm.plugins import MMPlugin

IMAGE_START, IMAGE_END = "<img>", "</img>"
# LLaMA-Factory's fixed tiling when `crop_to_patches` is on, whatever the image processor's own settings say
CROP_TO_PATCHES = {"crop_to_patches": True, "max_patches": 12, "min_patches": 1}


@dataclass(frozen=True)
class InternVLPlugin(MMPlugin):
    """`image_token` is the context token the model's features replace (`<IMG_CONTEXT>`)."""

    crops_to_patches = True
    videos_need_torchvision = False

    def image_options(self, settings: MediaSettings) -> dict[str, Any]:
        """Without `crop_to_patches` the image processor's own settings hold (one tile, for InternVL's releases)."""
        return dict(CROP_TO_PATCHES) if settings.crop_to_patches else {}

    def tiles_text(self, tiles: int, processor: Any) -> str:
        return IMAGE_START + self.image_token * (processor.image_seq_length * tiles) + IMAGE_END

    def image_texts(self, images: list, processor: Any, settings: MediaSettings) -> list[str]:
        options = self.image_options(settings)
        texts = []
        for image in images:
            width, height = image_size(image, settings.image_max_pixels, settings.image_min_pixels)
            tiles = processor.image_processor.get_number_of_image_patches(height, width, options)
            texts.append(self.tiles_text(tiles, processor))
        return texts

    def video_texts(self, videos: list, processor: Any, settings: MediaSettings) -> list[str]:
        frame = self.tiles_text(1, processor)
        return ["\n".join(f"Frame{i + 1}: {frame}" for i in range(len(sample_video(video, settings, decode=False)
                                                                          .indices)))
                for video in videos]

    def batch_inputs(self, images: list, videos: list, batch_ids: list[list[int]], processor: Any,
                     settings: MediaSettings = MediaSettings()) -> dict[str, Any]:
        """`pixel_values` alone: the images' tiles, then the videos' frames (the model finds each image's tiles by
        counting context tokens)."""
        import torch

        parts = []
        if images:
            regularized = [regularize_image(image, settings.image_max_pixels, settings.image_min_pixels)
                           for image in images]
            parts.append(processor.image_processor(regularized, return_tensors="pt",
                                                   **self.image_options(settings))["pixel_values"])
        if videos:
            frames = [regularize_image(frame, settings.video_max_pixels, settings.video_min_pixels)
                      for video in videos for frame in sample_video(video, settings).frames]
            parts.append(processor.image_processor(frames, return_tensors="pt", crop_to_patches=False)["pixel_values"])
        return {"pixel_values": torch.cat(parts)} if parts else {}


PLUGINS: dict[str, MMPlugin] = {"intern_vl": InternVLPlugin("intern_vl", image_token="<IMG_CONTEXT>",
                                                            video_token="<video>")}
