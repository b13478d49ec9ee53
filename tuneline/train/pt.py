"""Pre-training (continued): causal LM loss over every non-padding token; eval perplexity.

Run: `python -m tuneline.train examples/pt_lora.yaml`.
"""

from __future__ import annotations

from functools import partial

from tuneline.train.trainer_base import StageSpec, run_stage

SPEC = StageSpec(name="pt", perplexity=True)


run = partial(run_stage, spec=SPEC)  # the stage interface: run(config, dataset_ref, extra_callbacks)
