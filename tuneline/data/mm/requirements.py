"""What a video dataset needs installed, said before anything starts: PyAV, and torchvision, on which transformers
builds every video processor; without them a run would fail only when the first batch is made."""

from __future__ import annotations

import importlib.util
from functools import lru_cache

from tuneline.data.media import pyav_problem


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


def video_requirements_problem(needs_torchvision: bool = True) -> str | None:
    """Why videos cannot be read here (PyAV to decode them, torchvision for every transformers video processor), or
    None. Images need neither: a Qwen-VL model without torchvision gets its processor's image half
    (`tuneline.model.image_only_processor`). `needs_torchvision` False: the plugin sends frames through the image
    processor (InternVL), so PyAV suffices."""
    if problem := pyav_problem():
        return problem
    if not needs_torchvision or torchvision_works():
        return None
    import torch

    return ("reading videos needs torchvision (transformers builds every video processor on it), and `import "
            "torchvision` fails here: install the torchvision release made for torch "
            f"{torch.__version__.split('+')[0]} from the same index as torch (for a CPU torch: "
            "`pip install torchvision --index-url https://download.pytorch.org/whl/cpu`), or leave the videos out")
