"""`stage: ppo` -- PPO against a reward model trained by `stage: rm`, with adaptive KL control to the reference.

Run through the flow (`tuneline train examples/ppo_lora_demo.yaml`) or in a training process
(`accelerate launch -m tuneline.train <config>`), which calls `run` below.

Why a compact loop of our own: trl 1.16 has no PPO, and pinning trl 1.12 for `trl.experimental.ppo` would pin
the whole project to an experimental trainer that wants its own dataset and reward-model shapes. One PPO step:
sample `per_device_train_batch_size * gradient_accumulation_steps * ppo_buffer_size` prompts, generate answers
with the generating config (`max_new_tokens`, `top_k`, `top_p`, `temperature`), score them with the reward
model, take the policy's, the reference's and the value head's per-token numbers, turn score and KL penalty
into per-token rewards, estimate advantages with GAE, then `ppo_epochs` passes of clipped policy and value
losses over mini-batches of `per_device_train_batch_size * gradient_accumulation_steps` (accumulated in
micro-batches). The arithmetic lives in `ppo_core` (pure functions), the value head and reference in
`ppo_models`, and what the evaluation shares (the reward model, its scores, the seeded sampling) in
`tuneline.objectives.rewards`.
The processes are `accelerate.Accelerator`'s. With several (GPUs, or `num_processes`) it is data parallel: each
samples its share of the prompts, the score normalisation, whitening and KL statistics are taken over all
processes' answers (`gather`, `reduce`), and gradients are averaged by the DistributedDataParallel `prepare` wraps
the policy and value head in (no DeepSpeed or FSDP). Checkpoints are the accelerator's `save_state`, complete or
absent, and hold every state the next step depends on, so a run resumed from checkpoint k ends as the
uninterrupted run does.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tuneline.errors import UserError
from tuneline.model.optimizers import loop_optimizer
from tuneline.objectives.rewards import load_reward_model, sequence_scores
from tuneline.objectives.rollouts import sample_answers, sampled_reward
from tuneline.train import ppo_core
from tuneline.train.ppo_models import ValueHead, load_policy, load_reference, save_policy
from tuneline.train.ppo_schedule import PPOSchedule, loader_settings, lr_scheduler, prompt_batches
from tuneline.train.trainer_base import speak_trained_template


@dataclass
class PPOHyper:
    """LLaMA-Factory's (trl's) PPO defaults for what the config has no key for."""

    clip: float = 0.2
    clip_value: float = 0.2
    vf_coef: float = 0.1
    gamma: float = 1.0
    lam: float = 0.95


@dataclass
class Rollout:
    """Right-padded prompt+answer rows and the per-token numbers of the frame predicting token t from t-1."""

    ids: Any
    attention_mask: Any
    mask: Any  # 1 where the predicted token is an answer token
    scores: Any
    logps: Any = None
    values: Any = None
    advantages: Any = None
    returns: Any = None


def forward_tokens(model, ids, attention_mask, temperature: float, head=None):
    """Per-token log-probs of ids[:, 1:] (logits divided by the sampling temperature) and, with a head, values."""
    out = model(input_ids=ids, attention_mask=attention_mask, use_cache=False, output_hidden_states=head is not None)
    logits = out.logits[:, :-1].float() / max(temperature, 1e-5)
    logps = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    values = head(out.hidden_states[-1][:, :-1]) if head is not None else None
    return logps, values


def loop_accelerator(args):
    """The accelerator of the processes `accelerate launch` started (reading `args.device` first sets them up as
    TrainingArguments does, which resets accelerate's state).

    Without its mixed precision: the weights load in the run's dtype already, so autocast would only make the
    update's log-probs differ from the rollout's, and fp16 gradient scaling cannot unscale fp16 parameters (full
    tuning). The scheduler steps once per PPO step, not once per process as it would after a sharded dataloader.
    """
    from accelerate import Accelerator

    return Accelerator(cpu=args.device.type == "cpu", mixed_precision="no", step_scheduler_with_optimizer=False)


class PPOLoop:
    """Rollout, advantages and optimisation for one policy; `step()` is one PPO step."""

    def __init__(self, config, args, policy, tokenizer, reward_model, head, reference, ref_context):
        self.config, self.args, self.tokenizer = config, args, tokenizer
        self.policy, self.reward_model, self.head = policy, reward_model, head
        self.reference, self.ref_context = reference, ref_context
        self.accelerator = loop_accelerator(args)
        self.hyper = PPOHyper()
        ft = config.finetuning
        self.kl = ppo_core.AdaptiveKL(ft.ppo_init_kl_coef, ft.ppo_target)
        self.gen = config.generating
        optimizer = loop_optimizer(policy, head, args, ft)  # `optim`, LoRA+, as the Trainer builds them
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        # what optimise() runs forward and backward through: the same modules, wrapped for data parallelism
        self.trained_policy, self.trained_head, self.optimizer = self.accelerator.prepare(policy, head, optimizer)
        self.minibatch_order = torch.Generator().manual_seed(args.seed)
        self.log_window: dict[str, list[float]] = {}  # metrics since the last log
        self.accelerator.register_for_checkpointing(self.kl, self)
        self.accelerator.register_save_state_pre_hook(self.save_weights)
        self.accelerator.register_load_state_pre_hook(self.load_weights)

    def generate(self, batch):
        return sample_answers(self.policy, self.tokenizer, batch, self.gen)

    @torch.no_grad()
    def rollout(self, batch) -> Rollout:
        ids, attention, mask = self.generate(batch)
        scores = sequence_scores(self.reward_model, ids, attention).float()
        roll = Rollout(ids, attention, mask, scores)
        self.policy.eval()
        temperature = self.gen.temperature if self.gen.do_sample else 1.0
        roll.logps, roll.values = forward_tokens(self.policy, ids, attention, temperature, self.head)
        with self.ref_context():
            ref_logps, _ = forward_tokens(self.reference, ids, attention, temperature)
        ft, total = self.config.finetuning, self.accelerator.reduce  # reduce: summed over the processes
        every = self.accelerator.gather(scores)  # every process's answers: the statistics of the whole rollout
        scores = (scores - every.mean()) / (every.std() + 1e-8) if ft.ppo_score_norm and len(every) > 1 else scores
        rewards, kl = ppo_core.token_rewards(scores, roll.logps, ref_logps, mask, self.kl.coef)
        if ft.ppo_whiten_rewards:
            rewards = ppo_core.masked_whiten(rewards, mask, shift_mean=False, total=total)
        advantages, roll.returns = ppo_core.gae(rewards, roll.values, mask, self.hyper.gamma, self.hyper.lam)
        roll.advantages = ppo_core.masked_whiten(advantages, mask, total=total)
        roll.kl = self.means({"kl": kl.sum(-1).mean().item()})["kl"]
        return roll

    def optimise(self, roll: Rollout) -> dict[str, float]:
        """`ppo_epochs` passes of shuffled mini-batches; returns the mean losses.

        One optimizer step per `per_device_train_batch_size * gradient_accumulation_steps` answers, its
        gradient accumulated over micro-batches of `per_device_train_batch_size` (as LLaMA-Factory's PPO) and
        averaged over the processes on the last one.
        """
        args, accelerator = self.args, self.accelerator
        micro = args.per_device_train_batch_size
        size = micro * max(1, args.gradient_accumulation_steps)
        temperature = self.gen.temperature if self.gen.do_sample else 1.0
        sums: dict[str, float] = {}
        count = 0
        self.trained_policy.train()
        for _ in range(self.config.finetuning.ppo_epochs):
            order = torch.randperm(len(roll.ids), generator=self.minibatch_order)
            for group in order.split(size):
                micros = group.split(micro)
                for i, rows in enumerate(micros):
                    with self.gradient_sync(i == len(micros) - 1):
                        losses = self.losses(roll, rows, temperature)
                        accelerator.backward(losses["loss"] * len(rows) / len(group))
                    for name, value in losses.items():
                        sums[name] = sums.get(name, 0.0) + value.item()
                    count += 1
                if args.max_grad_norm:
                    accelerator.clip_grad_norm_(self.params, args.max_grad_norm)
                self.optimizer.step()
                self.optimizer.zero_grad()
        return {name: total / max(count, 1) for name, total in sums.items()}  # this process's means

    def losses(self, roll: Rollout, rows, temperature: float) -> dict:
        mask, hyper = roll.mask[rows], self.hyper
        logps, values = forward_tokens(self.trained_policy, roll.ids[rows], roll.attention_mask[rows], temperature,
                                       self.trained_head)
        pg, clipfrac = ppo_core.policy_loss(logps, roll.logps[rows], roll.advantages[rows], mask, hyper.clip)
        vf = ppo_core.value_loss(values, roll.values[rows], roll.returns[rows], mask, hyper.clip_value)
        return {"policy_loss": pg, "value_loss": vf, "loss": pg + hyper.vf_coef * vf, "clipfrac": clipfrac}

    def gradient_sync(self, now: bool) -> contextlib.ExitStack:
        """Gradients averaged over the processes in this backward, or (`no_sync`) kept for a later one."""
        stack = contextlib.ExitStack()
        for module in () if now else (self.trained_policy, self.trained_head):
            stack.enter_context(self.accelerator.no_sync(module))
        return stack

    def step(self, batch) -> dict[str, float]:
        batch = {k: v.to(self.args.device) for k, v in batch.items() if hasattr(v, "to")}
        roll = self.rollout(batch)
        metrics = self.optimise(roll)
        metrics.update(reward=roll.scores.mean().item(), response_length=roll.mask.sum(-1).mean().item())
        metrics = self.means(metrics)
        metrics.update(kl=roll.kl, kl_coef=self.kl.coef)  # roll.kl is already the mean over the processes
        self.kl.update(roll.kl, len(roll.ids) * self.accelerator.num_processes)
        return metrics

    def means(self, values: dict[str, float]) -> dict[str, float]:
        """Each value averaged over the processes, in one exchange."""
        tensor = torch.tensor(list(values.values()), dtype=torch.float64, device=self.accelerator.device)
        return dict(zip(values, self.accelerator.reduce(tensor, "mean").tolist(), strict=True))

    def mean_reward(self, dataset, collator) -> float:
        return sampled_reward(self.policy, self.reward_model, self.tokenizer, dataset, collator, self.gen,
                              seed=self.args.seed, batch_size=self.args.per_device_eval_batch_size,
                              limit=self.config.pipeline.eval_max_samples)

    def state_dict(self) -> dict:
        """What the next steps draw on besides the random states accelerate keeps: the mini-batch order, and the
        metrics of the logging window not yet logged."""
        return {"minibatch_rng": self.minibatch_order.get_state(), "log_window": self.log_window}

    def load_state_dict(self, state: dict) -> None:
        self.minibatch_order.set_state(state["minibatch_rng"])
        self.log_window = state["log_window"]

    def save_weights(self, models, weights, folder: str) -> None:
        """`save_state` hook: the policy as `save_pretrained` writes it (for LoRA the adapter, not the whole model)
        and the value head, in place of accelerate's full state dicts."""
        if self.accelerator.is_main_process:
            save_policy(self.policy, self.tokenizer, self.head, Path(folder))
        weights.clear()

    def load_weights(self, models, folder: str) -> None:
        """`load_state` hook: what `save_weights` wrote."""
        load_policy(self.policy, self.head, Path(folder))
        models.clear()


def save_checkpoint(loop: PPOLoop, state, output_dir: Path) -> None:
    """checkpoint-N: the accelerator's `save_state` under .partial/, renamed once every process has written its part;
    trainer_state.json marks it complete.

    Besides weights, optimizer and scheduler it holds each process's random states (sampling and dropout), the KL
    coefficient, the mini-batch order and the metrics not yet logged, so a resumed run repeats the uninterrupted one.
    """
    from transformers.trainer_utils import rotate_checkpoints

    from tuneline.train.checkpoints import TRAINER_STATE, publish, staging_root

    name = f"checkpoint-{state.global_step}"
    staged = staging_root(output_dir) / name
    accelerator = loop.accelerator
    accelerator.save_state(str(staged))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        state.save_to_json(str(staged / TRAINER_STATE))
        publish(staged, output_dir / name)
        rotate_checkpoints(str(output_dir), loop.args.save_total_limit, None)
    accelerator.wait_for_everyone()


def resume_from(loop: PPOLoop, state, checkpoint: Path) -> None:
    """Load what `save_checkpoint` wrote, in every process, and the step and log history it had reached."""
    from accelerate.utils import RNG_STATE_NAME
    from transformers import TrainerState

    from tuneline.train.checkpoints import TRAINER_STATE

    accelerator = loop.accelerator
    if not (checkpoint / f"{RNG_STATE_NAME}_{accelerator.process_index}.pkl").is_file():
        raise UserError(f"{checkpoint} holds no random state for process {accelerator.process_index}: it was saved "
                        f"by fewer processes than the {accelerator.num_processes} now running, or by a tuneline "
                        "before PPO checkpoints were accelerate's; resume with the same number of processes, or "
                        "start again with overwrite_output_dir: true", title="cannot resume")
    accelerator.load_state(str(checkpoint))
    restored = TrainerState.load_from_json(str(checkpoint / TRAINER_STATE))
    state.global_step, state.log_history = restored.global_step, restored.log_history


def train_loop(loop: PPOLoop, datasets, collator, callbacks: list, output_dir: Path) -> dict[str, float]:
    """PPO steps until max_steps (or num_train_epochs of prompts), logging and checkpointing on the way."""
    from transformers import TrainerControl, TrainerState

    from tuneline.train.callbacks import MlflowMetricsCallback

    args, accelerator = loop.args, loop.accelerator
    train = datasets["train"]
    plan = PPOSchedule.plan(args, loop.config.finetuning.ppo_buffer_size, len(train), accelerator.num_processes)
    max_steps = plan.max_steps
    scheduler = accelerator.prepare(lr_scheduler(loop.optimizer, args, max_steps))  # saved with the checkpoints
    state = TrainerState(max_steps=max_steps, logging_steps=args.logging_steps,
                         is_local_process_zero=accelerator.is_local_main_process,
                         is_world_process_zero=accelerator.is_main_process)  # the callbacks log on the main one
    control = TrainerControl()
    loop.state = state
    resume = loop.config.training.get("resume_from_checkpoint")
    if resume:
        resume_from(loop, state, Path(resume))
    for callback in callbacks:
        callback.on_train_begin(args, state, control, model=loop.policy)
    if state.global_step == 0 and has_validation(datasets):  # the reward before training, to compare with after
        _log(callbacks, args, state, {"eval_reward": loop.mean_reward(datasets["validation"], collator)})
    batches = prompt_batches(train, collator, plan.rollout_size, args.seed, skip=state.global_step,
                             rank=accelerator.process_index, world=accelerator.num_processes,
                             loader=loader_settings(args))
    window = loop.log_window
    start = time.time()
    while state.global_step < max_steps:
        for name, value in loop.step(next(batches)).items():
            window.setdefault(name, []).append(ppo_core.finite(value))
        scheduler.step()
        state.global_step += 1
        state.epoch = state.global_step / plan.per_epoch
        for callback in callbacks:  # the torch profiler's schedule advances per step
            callback.on_step_end(args, state, control, model=loop.policy)
        if plan.logs_at(state.global_step):
            logs = {name: sum(v) / len(v) for name, v in window.items()}
            logs["learning_rate"] = scheduler.get_last_lr()[0]
            _log(callbacks, args, state, logs)
            window.clear()
        if plan.saves_at(state.global_step):
            save_checkpoint(loop, state, output_dir)
            for callback in callbacks:
                if isinstance(callback, MlflowMetricsCallback):
                    callback.flush()  # the steps this checkpoint covers reach MLflow before a resume from it
    for callback in callbacks:
        callback.on_train_end(args, state, control, model=loop.policy)
    return {"train_runtime": time.time() - start, "train_steps": float(state.global_step),
            "train_reward": state.log_history[-1].get("reward", 0.0) if state.log_history else 0.0}


def write_results(output_dir: Path, train: dict, evals: dict) -> None:
    for name, values in (("train_results.json", train), ("eval_results.json", evals),
                         ("all_results.json", {**train, **evals})):
        if values:
            (output_dir / name).write_text(json.dumps(values, indent=2))


def run(config, dataset_ref: dict, extra_callbacks: list) -> dict:
    """Train the ppo stage on the processed prompts; returns output_dir, global step and metrics."""
    from transformers import enable_full_determinism, set_seed

    from tuneline.data import build_collator, load_processed
    from tuneline.model import load_model, load_tokenizer
    from tuneline.train.callbacks import MlflowMetricsCallback, build_callbacks
    from tuneline.train.training_args import build_training_args

    args = build_training_args(config)
    if args.full_determinism:
        enable_full_determinism(args.seed)
    else:
        set_seed(args.seed)
    output_dir = Path(args.output_dir)
    tokenizer = load_tokenizer(config.model)
    tokenizer.padding_side = "left"
    datasets = load_processed(dataset_ref)
    reward_model = load_reward_model(config, tokenizer).to(args.device)
    policy = load_model(config, tokenizer, is_trainable=True).to(args.device)
    reference, context = load_reference(config, tokenizer, policy)
    head = ValueHead(policy.config.hidden_size).to(args.device)
    speak_trained_template(config, tokenizer)
    loop = PPOLoop(config, args, policy, tokenizer, reward_model, head, reference.to(args.device), context)
    collator = build_collator("ppo", tokenizer, config.data.pad_to_multiple_of)
    callbacks = build_callbacks(config, output_dir, extra_callbacks)
    if config.finetuning.pissa_convert:
        from tuneline.model.pissa import PissaConvertCallback, convert_pissa_adapter, pissa_init_dir

        callbacks.append(PissaConvertCallback())  # saves the initial adapter when training starts
    try:
        train_metrics = train_loop(loop, datasets, collator, callbacks, output_dir)
        if loop.accelerator.is_main_process:
            save_policy(policy, tokenizer, head, output_dir)
            if config.finetuning.pissa_convert:  # what evaluation, export and users load: plain LoRA
                convert_pissa_adapter(policy, output_dir, pissa_init_dir(output_dir))
        evals = {}
        if has_validation(datasets):  # every process samples the same prompts with the same seed
            evals["eval_reward"] = loop.mean_reward(datasets["validation"], collator)
            _log(callbacks, args, loop.state, evals)
        if loop.accelerator.is_main_process:
            write_results(output_dir, train_metrics, evals)
        loop.accelerator.wait_for_everyone()
    finally:
        for callback in callbacks:
            if isinstance(callback, MlflowMetricsCallback):
                callback.close()
    return {"output_dir": str(output_dir), "global_step": int(train_metrics["train_steps"]),
            "metrics": {**train_metrics, **evals}}


def has_validation(datasets) -> bool:
    return "validation" in datasets and len(datasets["validation"]) > 0


def _log(callbacks: list, args, state, logs: dict[str, float]) -> None:
    from transformers import TrainerControl

    state.log_history.append({**logs, "step": state.global_step})
    for callback in callbacks:
        callback.on_log(args, state, TrainerControl(), logs=logs)
