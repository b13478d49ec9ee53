"""Pre-training (continued): causal LM loss over every non-padding token; eval perplexity.

Run: `python -m tuneline.train examples/pt_lora.yaml`.
"""

from __future__ import annotations

from typing import Any

from tuneline.train.trainer_base import StageSpec, run_stage

SPEC = StageSpec(name="pt", perplexity=True)


def run(config, dataset_ref: dict, extra_callbacks: list | None = None) -> dict[str, Any]:
    return run_stage(config, dataset_ref, extra_callbacks or [], SPEC)
