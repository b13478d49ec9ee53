"""The multimodal plugin every family's extends: a text-only model's, which leaves text alone and refuses media.

A family's plugin (in `tuneline.data.mm.plugins`, or a module of its own there) says how many tokens an image or video
becomes and adds its model's own tensors; `tuneline.data.mm.plugins.get_mm_plugin` names them all."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tuneline.data.media import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER
from tuneline.data.mm.pixels import MediaSettings, regularize_image
from tuneline.errors import ConfigError, DataError

_PLACEHOLDERS = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)}|{re.escape(VIDEO_PLACEHOLDER)})")


@dataclass(frozen=True)
class MMPlugin:
    """A text-only model's plugin: it leaves text alone and refuses media. Subclasses say how many tokens an image
    (or video) becomes (`image_texts`, `video_texts`) and add model-specific tensors (`batch_inputs`)."""

    name: str = "base"
    image_token: str | None = None
    video_token: str | None = None
    qwen_sizes = False  # Qwen-VL's extra side and ratio limits on top of the pixel limits
    pans_and_scans = False  # takes `image_do_pan_and_scan` (Gemma 3); other plugins refuse it
    token_inputs = ()  # batch tensors along the tokens (axis 1): the collator pads them as the ids
    crops_to_patches = False  # takes `crop_to_patches` (InternVL); other plugins refuse it
    videos_need_torchvision = True  # its videos go through a transformers video processor (all but InternVL's)
    unencoded_videos = None  # why its videos are refused (a str), where LLaMA-Factory's plugin reads them

    def expand_messages(self, messages: list[dict], images: list = (), videos: list = (), processor: Any = None,
                        settings: MediaSettings = MediaSettings()) -> list[dict]:
        """The messages with every placeholder replaced by the model's tokens for its image or video, in order."""
        self.check_media(messages, images, videos, processor)
        image_texts = iter(self.image_texts(list(images), processor, settings) if images else ())
        video_texts = iter(self.video_texts(list(videos), processor, settings) if videos else ())
        expanded = []
        for message in messages:
            parts = _PLACEHOLDERS.split(message["content"])
            content = "".join(next(image_texts) if part == IMAGE_PLACEHOLDER else
                              next(video_texts) if part == VIDEO_PLACEHOLDER else part for part in parts)
            expanded.append({**message, "content": content})
        return expanded

    def add_media_ids(self, ids: list[int], labels: list[int] | None, images: list, videos: list,
                      processor: Any) -> tuple[list[int], list[int] | None]:
        """A row's encoded ids (and labels, when given) with the media tokens a model takes at the token level rather
        than in the text (PaliGemma's, before everything); the encoder hands every row's ids through here. Most
        models' tokens are in the text (`expand_messages`): the ids come back as they are."""
        return ids, labels

    def batch_inputs(self, images: list, videos: list, batch_ids: list[list[int]], processor: Any,
                     settings: MediaSettings = MediaSettings()) -> dict[str, Any]:
        """The model's vision inputs for a batch: all its images, then all its videos, in row order;
        `batch_ids`: each row's token ids, unpadded."""
        inputs: dict[str, Any] = {}
        if images:
            regularized = [regularize_image(image, settings.image_max_pixels, settings.image_min_pixels,
                                            self.qwen_sizes) for image in images]
            inputs.update(processor.image_processor(regularized, return_tensors="pt", **self.image_options(settings)))
        if videos:
            inputs.update(self.video_inputs(videos, processor, settings))
        return inputs

    def check_media(self, messages: list[dict], images: list, videos: list, processor: Any) -> None:
        """Refuses media this model cannot take, and placeholders that do not match the media one for one."""
        problems = []
        for kind, media, token in (("image", images, self.image_token), ("video", videos, self.video_token)):
            placeholder = IMAGE_PLACEHOLDER if kind == "image" else VIDEO_PLACEHOLDER
            placeholders = sum(message["content"].count(placeholder) for message in messages)
            if media and token is None:
                problems.append(f"the template's multimodal plugin '{self.name}' takes no {kind}s, and the row has "
                                f"{len(media)}; use a template whose model reads {kind}s")
            elif placeholders != len(media):
                problems.append(f"the messages hold {placeholders} {placeholder} placeholder(s) but the row has "
                                f"{len(media)} {kind}(s); each {kind} needs exactly one {placeholder} where it goes")
        if problems:
            raise DataError(problems)
        if (images or videos) and getattr(processor, "image_processor", None) is None:
            raise ConfigError(f"the '{self.name}' plugin needs the model's processor (AutoProcessor) with an image "
                              "processor to count image tokens; the model folder has none")

    def image_options(self, settings: MediaSettings) -> dict[str, Any]:
        """Keyword arguments for the image processor beyond the images."""
        return {}

    def image_texts(self, images: list, processor: Any, settings: MediaSettings) -> list[str]:
        raise NotImplementedError

    def video_texts(self, videos: list, processor: Any, settings: MediaSettings) -> list[str]:
        raise NotImplementedError

    def video_inputs(self, videos: list, processor: Any, settings: MediaSettings) -> dict[str, Any]:
        raise NotImplementedError

    def readable(self, text: str) -> str:
        """A decoded prompt with each run of an image's tokens (hundreds for some models) written as one <image>."""
        if not self.image_token:
            return text
        return re.sub(f"(?:{re.escape(self.image_token)})+", IMAGE_PLACEHOLDER, text)
