"""When PPO's loop logs and saves, how long it runs, its learning rates and the prompts each step draws: derived
from the training arguments, `ppo_buffer_size` and the prompts, apart from the loop so that what a config asks for
is read without training.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tuneline.errors import UserError


@dataclass(frozen=True)
class PPOSchedule:
    """Steps, logging and checkpoints of one PPO run, as TrainingArguments name them."""

    rollout_size: int  # answers each process samples per step
    per_epoch: int  # steps per epoch of prompts
    max_steps: int
    logging_steps: int
    logging_first_step: bool
    save_strategy: str
    save_steps: int

    @classmethod
    def plan(cls, args, ppo_buffer_size: int, prompts: int, world: int = 1) -> PPOSchedule:
        """`per_device_train_batch_size x gradient_accumulation_steps x ppo_buffer_size` answers per process and
        step; `max_steps`, else `num_train_epochs` epochs of `prompts`."""
        rollout = args.per_device_train_batch_size * max(1, args.gradient_accumulation_steps) * max(1, ppo_buffer_size)
        per_epoch = max(1, prompts // (rollout * world))
        max_steps = args.max_steps if args.max_steps > 0 else int(args.num_train_epochs * per_epoch)
        return cls(rollout, per_epoch, max_steps, max(1, int(args.logging_steps)), bool(args.logging_first_step),
                   str(getattr(args.save_strategy, "value", args.save_strategy)), int(args.save_steps or 0))

    def logs_at(self, step: int) -> bool:
        return step % self.logging_steps == 0 or step == self.max_steps or (self.logging_first_step and step == 1)

    def saves_at(self, step: int) -> bool:
        """Every `save_steps` steps, or at the end of each epoch of prompts (`save_strategy: epoch`)."""
        if self.save_strategy == "steps":
            return bool(self.save_steps) and step % self.save_steps == 0
        return self.save_strategy == "epoch" and step % self.per_epoch == 0


def lr_scheduler(optimizer, args, max_steps: int):
    """transformers' scheduler as the Trainer builds it: `lr_scheduler_type` with `lr_scheduler_kwargs`, warmup."""
    from transformers import get_scheduler

    return get_scheduler(args.lr_scheduler_type, optimizer, args.get_warmup_steps(max_steps), max_steps,
                         scheduler_specific_kwargs=args.lr_scheduler_kwargs)


def prompt_batches(dataset, collator, batch_size: int, seed: int, skip: int = 0, rank: int = 0, world: int = 1,
                   loader: dict | None = None):
    """Endless shuffled batches of prompts, one epoch after another, after skipping the first `skip`.

    The order depends on the seed alone, so a resumed run skips the batches it already trained on (drawing
    index orders only, no rows) and continues with the ones the uninterrupted run would have seen. With
    `world` processes, `batch_size` is each one's share: process `rank` takes every world-th row of a batch of
    batch_size * world prompts. `loader`: DataLoader settings (workers), as `loader_settings` reads them.
    """
    if world > 1 and len(dataset) < world:
        raise UserError(f"ppo has {len(dataset)} training prompts for {world} processes; each needs at least one",
                        title="ppo")
    from torch.utils.data import DataLoader

    order = PromptOrder(len(dataset), batch_size * world, seed, skip, rank, world)
    rows = DataLoader(dataset.select_columns(["input_ids", "attention_mask"]), batch_sampler=order,
                      collate_fn=collator, generator=torch.Generator().manual_seed(seed), **(loader or {}))
    while True:  # the generator seeds workers only: the global random state stays the sampling's
        yield from rows


class PromptOrder:
    """Batches of row indices, this process's share of each, one seeded shuffle per epoch; the first `skip` are
    drawn and dropped."""

    def __init__(self, size: int, batch_size: int, seed: int, skip: int, rank: int, world: int):
        from torch.utils.data import DataLoader

        generator = torch.Generator().manual_seed(seed)
        self.indices = DataLoader(range(size), batch_size=batch_size, shuffle=True, generator=generator,
                                  drop_last=size >= batch_size, collate_fn=list)
        self.skip, self.rank, self.world = skip, rank, world

    def __iter__(self):
        for rows in self.indices:
            if self.skip:
                self.skip -= 1
                continue
            rows = rows[: len(rows) - len(rows) % self.world]  # an equal share each (a short last batch only)
            yield rows[self.rank::self.world]

    def __len__(self) -> int:
        return len(self.indices)


def loader_settings(args) -> dict:
    """The DataLoader settings the Trainer takes from TrainingArguments: workers, how they start, their prefetching,
    pinned memory."""
    settings = {"num_workers": args.dataloader_num_workers,
                "pin_memory": bool(args.dataloader_pin_memory) and torch.cuda.is_available()}
    if args.dataloader_num_workers:
        settings.update(persistent_workers=args.dataloader_persistent_workers,
                        prefetch_factor=args.dataloader_prefetch_factor,
                        multiprocessing_context=args.dataloader_multiprocessing_context)
    return settings
