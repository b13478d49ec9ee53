"""What a run with images or videos encodes them with: the template's plugin, the model's processor and the pixel
limits of the config, checked together before any row is encoded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneline.data.mm.pixels import MediaSettings
from tuneline.data.mm.plugins import MMPlugin, get_mm_plugin
from tuneline.data.mm.requirements import video_requirements_problem
from tuneline.errors import ConfigError, UserError

MEDIA_SETTINGS = ("image_max_pixels", "image_min_pixels", "video_max_pixels", "video_min_pixels", "video_fps",
                  "video_maxlen", "image_do_pan_and_scan", "crop_to_patches")
MEDIA_STAGES = ("sft", "rm", "dpo", "kto")  # stages whose encoding and batches carry images


@dataclass(frozen=True)
class RunMedia:
    plugin: MMPlugin
    processor: Any
    settings: MediaSettings

    def __post_init__(self):
        if self.settings.image_do_pan_and_scan and not self.plugin.pans_and_scans:
            raise ConfigError(pan_and_scan_refusal(self.plugin.name))
        if self.settings.crop_to_patches and not self.plugin.crops_to_patches:
            raise ConfigError(crop_to_patches_refusal(self.plugin.name))

    def expand(self, messages: list[dict], images: list, videos: list) -> list[dict]:
        return self.plugin.expand_messages(messages, images, videos, self.processor, self.settings)

    def add_media_ids(self, ids: list[int], labels: list[int] | None, images: list, videos: list):
        return self.plugin.add_media_ids(ids, labels, images, videos, self.processor)

    def batch_inputs(self, images: list, videos: list, batch_ids: list[list[int]]) -> dict[str, Any]:
        return self.plugin.batch_inputs(images, videos, batch_ids, self.processor, self.settings)


def pan_and_scan_refusal(plugin: str | None) -> str:
    return (f"'image_do_pan_and_scan: true' crops images for Gemma 3 only, and this template's image plugin is "
            f"'{plugin or 'none (text only)'}'; use 'template: gemma3' with a Gemma 3 model, or remove the key")


def crop_to_patches_refusal(plugin: str | None) -> str:
    return (f"'crop_to_patches: true' tiles images for InternVL only, and this template's image plugin is "
            f"'{plugin or 'none (text only)'}'; use 'template: intern_vl' (or intern_s1) with an InternVL model, or "
            "remove the key")


def has_media(dataset, kinds: tuple[str, ...] = ("images", "videos")) -> bool:
    """Whether any row of an encoded (`images`) or converted (`_images`) dataset names media of these kinds."""
    import pyarrow.compute as pc

    for column in [name for kind in kinds for name in (f"_{kind}", kind)]:
        if column in dataset.column_names and pc.max(pc.list_value_length(dataset.data.column(column))).as_py():
            return True
    return False


def media_settings(config) -> MediaSettings:
    """The config's pixel and frame limits."""
    return MediaSettings(**{key: getattr(config.model, key) for key in MEDIA_SETTINGS})


def run_media(config, tokenizer, template, has_videos: bool) -> RunMedia:
    """The media encoding of a run whose data holds images or videos; refuses a config that cannot read them."""
    from tuneline.data.template_catalog import VISION
    from tuneline.model.processor import load_processor

    if config.stage not in MEDIA_STAGES:
        raise ConfigError(f"the dataset holds images or videos, which 'stage: {config.stage}' does not train on yet; "
                          f"stages with images: {', '.join(MEDIA_STAGES)}")
    if template.mm_plugin is None:
        from tuneline.data.template_catalog import VISION

        raise ConfigError(f"the dataset holds images or videos, but 'template: {template.name}' reads text only; "
                          f"use the model's vision-language template ({', '.join(VISION)})")
    plugin = get_mm_plugin(template.mm_plugin)
    if has_videos and plugin.video_token is None:
        why = plugin.unencoded_videos or f"(multimodal plugin '{plugin.name}', as in LLaMA-Factory) reads images only"
        raise ConfigError(f"the dataset holds videos, but 'template: {template.name}' {why}; use a template whose "
                          f"model reads videos ({', '.join(video_templates())}), or leave the videos out")
    if config.effective_packing:
        raise ConfigError("'packing' joins rows, which rows with images cannot be; set 'packing: false'")
    if has_videos and (problem := video_requirements_problem(plugin.videos_need_torchvision)):
        raise UserError(problem)
    processor = load_processor(config, tokenizer)
    if processor is None:
        raise ConfigError(f"the dataset holds images or videos, but 'model_name_or_path' "
                          f"({config.model.model_name_or_path}) is a text-only model; use a vision-language model")
    return RunMedia(plugin, processor, media_settings(config))


def video_templates() -> list[str]:
    """The templates whose plugin reads videos."""
    from tuneline.data.template_catalog import TEMPLATES

    return sorted(name for name, template in TEMPLATES.items()
                  if template.mm_plugin and get_mm_plugin(template.mm_plugin).video_token)


def dataset_media(config, tokenizer, splits) -> RunMedia | None:
    """The media encoding of processed splits that hold images or videos (None for text): what training and
    evaluation batch them with."""
    from tuneline.data.template_catalog import run_template

    present = [split for split in splits if split is not None and has_media(split)]
    if not present:
        return None
    template = run_template(config.data, tokenizer)
    has_videos = any(has_media(split, ("videos",)) for split in present)
    return run_media(config, tokenizer, template, has_videos)
