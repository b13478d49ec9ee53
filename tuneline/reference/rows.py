"""Which training rows a run visits, decided from the config alone: the reference step computes only those.

A `max_steps` run shorter than an epoch visits the first positions of its first epoch's order (transformers'
`RandomSampler` seeded by accelerate with `data_seed`, else `seed`). Whatever cannot be foreseen as surely takes
every row; the trainer stops at a batch whose reference values are missing, so a wrong plan fails loudly."""

from __future__ import annotations

from typing import Any

from tuneline.runtime.devices import gpu_count

EVERY_ROW: dict[str, Any] = {"rows": "all"}
# transformers' TrainingArguments defaults for the keys the plan reads.
TRAINER_DEFAULTS = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "seed": 42}
FORESEEABLE_ORDERS = ("random", "sequential")


def sampling_order(config) -> str:
    """The train_sampling_strategy the run's TrainingArguments get (see tuneline.train.training_args)."""
    training = config.training
    if training.get("group_by_length"):
        return "group_by_length"
    if "train_sampling_strategy" in training:
        return str(training["train_sampling_strategy"])
    return "sequential" if config.finetuning.disable_shuffling else "random"


def training_processes(config) -> int:
    """How many processes the launch starts for this config on this machine (tuneline.pipeline.launch)."""
    gpus = gpu_count()
    use_cpu = not gpus or bool(config.training.get("use_cpu"))
    return int(config.pipeline.num_processes or (1 if use_cpu else gpus))


def visit_plan(config) -> dict[str, Any]:
    """`{"rows": "all"}`, or how many rows of which order the run visits: small, JSON-able, part of the step key."""
    training = config.training
    steps = int(training.get("max_steps") or -1)
    order = sampling_order(config)
    machines = getattr(config.pipeline, "num_machines", 1)  # each machine counts its own devices: not seen from here
    if (steps <= 0 or order not in FORESEEABLE_ORDERS or training.get("auto_find_batch_size") or machines > 1
            or training.get("accelerator_config") or config.pipeline.accelerate_config):
        return EVERY_ROW
    per_step = 1
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        per_step *= int(training.get(key) or TRAINER_DEFAULTS[key])
    plan: dict[str, Any] = {"rows": steps * per_step * training_processes(config), "order": order}
    if order == "random":
        seed = training.get("data_seed")
        plan["seed"] = int(seed if seed is not None else training.get("seed", TRAINER_DEFAULTS["seed"]))
    return plan


def visited_rows(plan: dict[str, Any], train_rows: int) -> list[int] | None:
    """Indices of the training rows the plan visits, in visiting order; None when it visits every row."""
    count = plan["rows"]
    if count == "all" or count >= train_rows:
        return None
    if plan["order"] == "sequential":
        return list(range(count))
    import torch

    generator = torch.Generator().manual_seed(plan["seed"])
    return torch.randperm(train_rows, generator=generator)[:count].tolist()
