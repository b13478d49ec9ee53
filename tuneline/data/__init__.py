"""Datasets: LLaMA-Factory's registry and formats, chat templates, per-stage encoding, a content-keyed cache.

Importing this package is cheap: heavy libraries load only inside the functions that need them."""

from tuneline.data.build import build_dataset, load_processed, with_lengths
from tuneline.data.cache_key import dataset_fingerprint
from tuneline.data.collators import build_collator
from tuneline.data.preview import preview
from tuneline.data.template_catalog import TEMPLATES, get_template, run_template
from tuneline.data.templates import Template

__all__ = [
    "TEMPLATES", "Template", "build_collator", "build_dataset", "dataset_fingerprint",
    "get_template", "run_template", "load_processed", "preview", "with_lengths",
]
