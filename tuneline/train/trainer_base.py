"""What every stage shares: a Trainer that saves checkpoints atomically and takes custom optimizers, and the
one shape of a stage run (tokenizer, data, model, trainer, train, save, evaluate)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from transformers import Trainer
from transformers.trainer_utils import rotate_checkpoints

from tuneline.errors import ConfigError
from tuneline.train.checkpoints import TRAINER_STATE, publish, staging_root

log = logging.getLogger(__name__)

# finetuning key that turns a custom optimizer on -> the tuneline.model function that builds it.
MEDIA_LOADER_WORKERS = 2  # default DataLoader workers when rows hold images: they decode while the model trains
CUSTOM_OPTIMIZERS = (("use_galore", "create_low_rank_optimizer"), ("use_apollo", "create_low_rank_optimizer"),
                     ("loraplus_lr_ratio", "create_loraplus_optimizer"), ("use_badam", "create_badam_optimizer"),
                     ("use_adam_mini", "create_adam_mini_optimizer"), ("use_muon", "create_muon_optimizer"))


def build_custom_optimizer(model, training_args, finetuning_args):
    """The optimizer a finetuning key asks for (built by tuneline.model; validation lets one at most be set), else
    None (the Trainer's own)."""
    if finetuning_args is None:
        return None
    for key, factory_name in CUSTOM_OPTIMIZERS:
        if getattr(finetuning_args, key, None):
            import tuneline.model as model_pkg

            return getattr(model_pkg, factory_name)(model, training_args, finetuning_args)
    return None


class TunelineTrainer(Trainer):
    """transformers' Trainer with checkpoints that are complete or absent, the custom optimizer hook, and what the
    finetuning keys need from the trainer (BAdam's callback and clipping, PiSSA's conversion at the final save)."""

    # Pair batches (chosen/rejected) have no `input_ids`, the only column transformers counts tokens of: a pair
    # stage counts them here, over every `*attention_mask`, and transformers' own count is switched off.
    counts_pair_tokens = False

    def __init__(self, *args, finetuning_args=None, train_collator=None, **kwargs):
        self.finetuning_args = finetuning_args
        self.train_collator = train_collator  # training batches only (flattened sft); evaluation keeps data_collator
        self._staging: str | None = None
        super().__init__(*args, **kwargs)
        self.pair_tokens_mode, self.pair_tokens_at_start = "no", None
        if self.counts_pair_tokens:
            self.pair_tokens_mode = self.args.include_num_input_tokens_seen
            self.args.include_num_input_tokens_seen = "no"
        if getattr(finetuning_args, "use_badam", False):
            from tuneline.model.optimizers import prepare_trainer_for_badam

            prepare_trainer_for_badam(self)
        if getattr(finetuning_args, "pissa_convert", False):
            from tuneline.model.pissa import PissaConvertCallback

            self.add_callback(PissaConvertCallback())

    def get_train_dataloader(self):
        if self.train_collator is None:
            return super().get_train_dataloader()
        eval_collator, self.data_collator = self.data_collator, self.train_collator
        try:
            return super().get_train_dataloader()
        finally:
            self.data_collator = eval_collator

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            self.optimizer = build_custom_optimizer(self.model, self.args, self.finetuning_args)
        return super().create_optimizer(model) if model is not None else super().create_optimizer()

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """With `pissa_convert`, the final save (checkpoints are internal calls and keep the PiSSA adapter to resume
        from) holds the adapter converted to plain LoRA on the original weights: what evaluation, export and
        users load."""
        super().save_model(output_dir, _internal_call)
        if not _internal_call and self.args.should_save and getattr(self.finetuning_args, "pissa_convert", False):
            from tuneline.model.pissa import convert_pissa_adapter, pissa_init_dir

            convert_pissa_adapter(self.accelerator.unwrap_model(self.model), output_dir or self.args.output_dir,
                                  pissa_init_dir(self.args.output_dir))

    def _run_epoch(self, *args, **kwargs):
        """Train nothing when resumed at or past the last step: transformers would skip the batches already seen
        and then run one step too many (checkpoint-N+1) before it checks max_steps. Training then ends as usual
        (best model loaded when asked, callbacks told) on the checkpoint's weights."""
        if self.state.max_steps and self.state.global_step >= self.state.max_steps:
            self.control.should_training_stop = True
            return None
        return super()._run_epoch(*args, **kwargs)

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.pair_tokens_mode != "no":
            self.count_pair_tokens(inputs)
        return super().training_step(model, inputs, num_items_in_batch)

    def count_pair_tokens(self, inputs) -> None:
        """Add the batch's tokens, both answers of each pair, to `num_input_tokens_seen` (all processes')."""
        import torch

        if self.pair_tokens_at_start is None:
            self.pair_tokens_at_start = self.state.num_input_tokens_seen  # a resumed run's state is loaded by now
        masks = [value for key, value in inputs.items() if key.endswith("attention_mask") and hasattr(value, "sum")]
        tokens = sum(int(m.sum()) if self.pair_tokens_mode == "non_padding" else m.numel() for m in masks)
        tokens = torch.as_tensor(tokens, device=self.args.device, dtype=torch.int64)
        self.state.num_input_tokens_seen += self.accelerator.gather(tokens).sum().item()

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Drop the meaningless train_loss (0.0) of a train() call that ran no step; a pair stage's token count
        logged as transformers logs its own."""
        if "train_loss" in logs and self.state.global_step == getattr(self, "_initial_global_step", None):
            logs.pop("train_loss")
        if self.pair_tokens_mode != "no":
            from transformers.trainer_utils import speed_metrics

            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if start_time is not None:
                seen = self.state.num_input_tokens_seen - (self.pair_tokens_at_start or 0)
                logs.update(speed_metrics("train", start_time, num_tokens=seen))
        super().log(logs, start_time)

    def _get_output_dir(self, trial) -> str:
        return self._staging if self._staging is not None else super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial) -> None:
        """Write checkpoint-N under .partial/, then rename it into place once every process has written."""
        import shutil

        run_dir = Path(super()._get_output_dir(trial))
        name = f"checkpoint-{self.state.global_step}"
        staging = staging_root(run_dir)
        if self.args.should_save:
            shutil.rmtree(staging / name, ignore_errors=True)
            staging.mkdir(parents=True, exist_ok=True)
        self.accelerator.wait_for_everyone()
        self._staging = str(staging)
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging = None
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            self._point_best_at(run_dir, staging / name)
            publish(staging / name, run_dir / name)
            rotate_checkpoints(str(run_dir), self.args.save_total_limit, self.state.best_model_checkpoint)
        self.accelerator.wait_for_everyone()

    def _point_best_at(self, run_dir: Path, staged: Path) -> None:
        """The state saved inside the staged folder must name final paths, not staging ones."""
        best = self.state.best_model_checkpoint
        if best and Path(best).parent == staged.parent:
            self.state.best_model_checkpoint = str(run_dir / Path(best).name)
            self.state.save_to_json(str(staged / TRAINER_STATE))


@dataclass
class StageSpec:
    """How one stage differs from the common run: its data collator, model head, trainer and metrics."""

    name: str
    trainer_class: type = TunelineTrainer
    add_valuehead: bool = False
    # (config, tokenizer) -> (compute_metrics, preprocess_logits_for_metrics), either may be None
    metrics: Callable[[Any, Any], tuple[Callable | None, Callable | None]] | None = None
    # (trainer, config, eval_dataset, tokenizer) -> extra metrics, run after training and evaluation
    after_train: Callable[..., dict[str, float]] | None = None
    perplexity: bool = False
    # (config, datasets, tokenizer) -> more keyword arguments of trainer_class (dpo/kto: their live reference model),
    # called before the seed is set and the policy loaded
    trainer_kwargs: Callable[[Any, Any, Any], dict[str, Any]] | None = None


def split_of(datasets, name: str):
    """A split of a DatasetDict, or None when absent or empty."""
    split = datasets.get(name) if hasattr(datasets, "get") else None
    return split if split is not None and len(split) > 0 else None


def build_trainer(config, spec: StageSpec, model, tokenizer, datasets, collator, callbacks: list, args=None):
    """The stage's trainer over already-loaded pieces (tests build them by hand)."""
    from tuneline.data import build_collator
    from tuneline.model.batching import batching, training_device
    from tuneline.train.training_args import build_training_args

    args = args or build_training_args(config)
    train, evals = split_of(datasets, "train"), split_of(datasets, "validation")
    if args.train_sampling_strategy == "group_by_length":  # lengths read in one arrow pass, not row by row
        from tuneline.data import with_lengths

        train, evals = (with_lengths(split, args.length_column_name) if split is not None else None
                        for split in (train, evals))
    if args.do_train and train is None:
        raise ConfigError("the training split is empty: check 'dataset', 'max_samples' and 'val_size'")
    if evals is None and args.eval_strategy != "no":
        raise ConfigError(f"'eval_strategy: {args.eval_strategy.value}' needs an evaluation split: set "
                          "'val_size' or 'eval_dataset', or set 'eval_strategy: no'")
    compute_metrics, preprocess = spec.metrics(config, tokenizer) if spec.metrics else (None, None)
    return spec.trainer_class(
        model=model, args=args, train_dataset=train, eval_dataset=evals, data_collator=collator,
        processing_class=tokenizer, callbacks=callbacks, compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess, finetuning_args=config.finetuning,
        train_collator=(build_collator(spec.name, tokenizer, flatten=True)
                        if getattr(collator, "media", None) is None and batching(config, training_device(config)).flatten else None))


def train_and_evaluate(trainer, config, spec: StageSpec, tokenizer) -> dict[str, Any]:
    """Train (resuming from config.training['resume_from_checkpoint']), save, evaluate; return the results."""
    args, metrics = trainer.args, {}
    if args.do_train:
        resume = config.training.get("resume_from_checkpoint")
        result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        trainer.save_model()
        trainer.save_state()
        trainer.log_metrics("train", result.metrics)
        trainer.save_metrics("train", result.metrics)
        metrics.update(result.metrics)
    # As LLaMA-Factory: a final evaluation only when asked; the flow's `evaluate tuned` scores the split anyway.
    if trainer.eval_dataset is not None and (args.do_eval or args.eval_strategy != "no"):
        eval_metrics = (args.do_train and evaluated_at_last_step(trainer)) or trainer.evaluate(metric_key_prefix="eval")
        if spec.perplexity and "eval_loss" in eval_metrics:
            eval_metrics["eval_perplexity"] = math.exp(min(eval_metrics["eval_loss"], 50.0))
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)
        metrics.update(eval_metrics)
    if spec.after_train is not None:
        metrics.update(spec.after_train(trainer, config, trainer.eval_dataset, tokenizer) or {})
    return metrics


def evaluated_at_last_step(trainer) -> dict[str, Any] | None:
    """The loop's own evaluation at its last step (`eval_steps` divides `max_steps`, or an epoch's end), when it
    scored the weights training ends with: evaluating them again would give the same numbers, at the price of a
    whole pass over the validation split. None with `load_best_model_at_end` (another checkpoint's weights)."""
    if trainer.args.load_best_model_at_end:
        return None
    last, metrics = trainer.state.global_step, {}
    for entry in reversed(trainer.state.log_history):
        if entry.get("step") != last:
            break
        if any(key.startswith("eval_") for key in entry):
            metrics = {**{k: v for k, v in entry.items() if k != "step"}, **metrics}
    return metrics or None


def run_stage(config, dataset_ref: dict, extra_callbacks: list, spec: StageSpec) -> dict[str, Any]:
    """The shape every stage shares: tokenizer, data, model, trainer, train, save, evaluate. A stage module's `run`
    is this with its spec bound (`functools.partial`), so no frame of its own sits on the way to `trainer.train`."""
    from functools import partial

    from transformers import set_seed

    from tuneline.data import build_collator, load_processed
    from tuneline.data.mm.run_media import dataset_media
    from tuneline.model.loader import load_model
    from tuneline.model.processor import SaveProcessorCallback
    from tuneline.model.tokenizer import load_tokenizer
    from tuneline.train.callbacks import build_callbacks
    from tuneline.train.training_args import build_training_args

    args = build_training_args(config)
    tokenizer = load_tokenizer(config.model)
    datasets = load_processed(dataset_ref)
    if spec.trainer_kwargs is not None:
        spec = replace(spec, trainer_class=partial(spec.trainer_class, **spec.trainer_kwargs(config, datasets, tokenizer)))
    set_seed(args.seed)
    model = load_model(config, tokenizer, is_trainable=args.do_train, add_valuehead=spec.add_valuehead)
    media = dataset_media(config, tokenizer, [split_of(datasets, "train"), split_of(datasets, "validation")])
    collator = build_collator(spec.name, tokenizer, config.data.pad_to_multiple_of, media=media)
    speak_trained_template(config, tokenizer, media.processor if media is not None else None)
    callbacks = build_callbacks(config, args.output_dir, extra_callbacks)
    if media is not None:
        callbacks.append(SaveProcessorCallback(media.processor))
        if "dataloader_num_workers" not in config.training:  # images are decoded beside the training loop
            args.dataloader_num_workers = MEDIA_LOADER_WORKERS
    trainer = build_trainer(config, spec, model, tokenizer, datasets, collator, callbacks, args=args)
    return run_trainer(trainer, config, spec, tokenizer, callbacks)


def speak_trained_template(config, tokenizer, processor=None) -> None:
    """The tokenizer (and processor) saved into output_dir and every checkpoint carry the training template as their
    chat_template, as an export does: users load and serve those folders directly, and a server formats prompts with
    the chat_template alone. Set once the data is built and the model loaded; nothing in training reads it."""
    from tuneline.export.chat_template import prepare_chat

    prepare_chat(config, tokenizer, processor)


def run_trainer(trainer, config, spec: StageSpec, tokenizer, callbacks: list) -> dict[str, Any]:
    """Train and evaluate a built trainer, closing the MLflow callback whatever happens; the stage's result."""
    from tuneline.train.callbacks import MlflowMetricsCallback

    try:
        metrics = train_and_evaluate(trainer, config, spec, tokenizer)
    finally:
        for callback in callbacks:
            if isinstance(callback, MlflowMetricsCallback):
                callback.close()
    return {"output_dir": str(trainer.args.output_dir), "global_step": trainer.state.global_step, "metrics": metrics}
