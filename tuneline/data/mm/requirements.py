"""What a vision-language config needs installed, said before anything starts: transformers builds every Qwen-VL
processor and every video processor on torchvision, and without it a run would fail only when the model loads."""

from __future__ import annotations

import importlib.util
from functools import lru_cache

from tuneline.data.media import pyav_problem

NEEDS_TORCHVISION = ("qwen2_vl", "qwen3_vl")  # their processors hold a video processor even for image-only data


@lru_cache(maxsize=1)
def torchvision_works() -> bool:
    """Installed is not enough: a torchvision built for another torch installs but fails on import."""
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401
    except Exception:  # e.g. `operator torchvision::nms does not exist` beside a CPU torch
        return False
    return True


def vision_requirements_problem(plugin_name: str | None, has_videos: bool) -> str | None:
    """Why this plugin (and videos, if the data has any) cannot run here, or None."""
    if has_videos and (problem := pyav_problem()):
        return problem
    if plugin_name not in NEEDS_TORCHVISION and not has_videos:
        return None
    if torchvision_works():
        return None
    import torch

    if plugin_name in NEEDS_TORCHVISION:
        what, otherwise = f"the '{plugin_name}' template's processor", "or use a llava or gemma3 model"
    else:
        what, otherwise = "reading videos", "or leave the videos out"
    return (f"{what} needs torchvision (transformers builds Qwen-VL processors and every video processor on it), and "
            f"`import torchvision` fails here: install the torchvision release made for torch "
            f"{torch.__version__.split('+')[0]} from the same index as torch (for a CPU torch: "
            f"`pip install torchvision --index-url https://download.pytorch.org/whl/cpu`), {otherwise}")
