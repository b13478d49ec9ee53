"""Images and videos for vision-language models: placeholder expansion at build time, pixel tensors in the collator.

`get_mm_plugin(template.mm_plugin)` gives the plugin; `MediaSettings` holds LLaMA-Factory's image/video limits."""

from tuneline.data.media import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER
from tuneline.data.mm.pixels import MediaSettings
from tuneline.data.mm.plugins import PLUGINS, MMPlugin, get_mm_plugin
from tuneline.data.mm.requirements import video_requirements_problem

__all__ = ["IMAGE_PLACEHOLDER", "PLUGINS", "VIDEO_PLACEHOLDER", "MMPlugin", "MediaSettings", "get_mm_plugin",
           "video_requirements_problem"]
