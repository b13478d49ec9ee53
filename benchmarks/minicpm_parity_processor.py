"""MiniCPM-V 4.6's tiny processors for benchmarks/mm_parity.py, loadable in both projects' environments.

transformers 5.6, which LLaMA-Factory 0.9.5 pins, has no MiniCPM-V 4.6 classes (they came in a later release), and
transformers' `MiniCPMV4_6Processor` is built only with its video processor, hence torchvision. So both sides get what
that processor hands a plugin: its image processor and tokenizer, and the attributes it sets from them (the marker
tokens, `default_use_image_id`, `slice_mode`). On LLaMA-Factory's side, where the image processor class does not
exist, its outputs for the demo rows' images are replayed: they are made when the folder is built, by transformers
5.24's `MiniCPMV4_6ImageProcessorPil`, from the very paths LLaMA-Factory's plugin hands it. The placeholders, ids and
batch fields are then each project's own code; the image processing is transformers' in both.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

# MiniCPM-V 4.6's tokens, by the tokenizer attributes its processor reads
NAMED_TOKENS = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "image_start_token": "<image>",
                "image_end_token": "</image>", "slice_start_token": "<slice>", "slice_end_token": "</slice>",
                "image_id_start_token": "<image_id>", "image_id_end_token": "</image_id>"}
# a 112-pixel slice resolution, below the demo images' sizes: each is cut into slices besides its overview
IMAGE_PROCESSOR = {"patch_size": 14, "scale_resolution": 112, "max_slice_nums": 9}
VARIANTS = {"minicpm_v_4_6": {}, "minicpm_v_4_6_4x": {"downsample_mode": "4x", "use_image_id": False}}
# LLaMA-Factory's batch also carries these; transformers' processor drops them as unused and the model never reads
# them, so tuneline leaves them out and the comparison does too
UNREAD_FIELDS = ("grids", "num_patches_per_image")
REPLAY = "replayed_image_outputs.pt"


def build(family: str, out: Path, tokenizer_folder: Path, image_lists: list[list[str]]) -> Path:
    """The tokenizer with MiniCPM's tokens, the image processor's config, and its outputs for `image_lists`."""
    import torch
    from transformers import AutoTokenizer, MiniCPMV4_6ImageProcessorPil

    out.mkdir(parents=True, exist_ok=True)
    AutoTokenizer.from_pretrained(tokenizer_folder, extra_special_tokens=NAMED_TOKENS).save_pretrained(out)
    image_processor = MiniCPMV4_6ImageProcessorPil(**IMAGE_PROCESSOR, **VARIANTS[family])
    image_processor.save_pretrained(out)
    outputs = {json.dumps(images): dict(image_processor(images, return_tensors="pt")) for images in image_lists}
    torch.save(outputs, out / REPLAY)
    return out


class ReplayedImageProcessor:
    """The image processor's settings and its outputs for the images it was built with (LLaMA-Factory's side)."""

    def __init__(self, folder: Path):
        import torch

        self.__dict__.update(json.loads((folder / "preprocessor_config.json").read_text()))
        self.outputs = torch.load(folder / REPLAY, weights_only=False)

    def __call__(self, images, **kwargs) -> dict:
        return dict(self.outputs[json.dumps([str(image) for image in images])])


def load(folder: Path) -> SimpleNamespace:
    """What MiniCPMV4_6Processor would give a plugin, as a plain object."""
    from transformers import AutoTokenizer

    try:
        from transformers import MiniCPMV4_6ImageProcessorPil

        image_processor = MiniCPMV4_6ImageProcessorPil.from_pretrained(folder)
    except ImportError:  # transformers 5.6, LLaMA-Factory's
        image_processor = ReplayedImageProcessor(Path(folder))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return SimpleNamespace(image_processor=image_processor, tokenizer=tokenizer,
                           default_use_image_id=image_processor.use_image_id, slice_mode=image_processor.slice_mode,
                           **{name: getattr(tokenizer, name) for name in NAMED_TOKENS})
