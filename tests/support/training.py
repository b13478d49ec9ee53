"""Helpers for the trainer tests: configs on the tiny model and small tokenized splits of the demo data.

The splits are tokenized here with the tiny model's chat template (prompt tokens labelled -100), the columns
tuneline.data produces for sft/pt/rm, so the trainers are tested without depending on the data pipeline.
"""

from __future__ import annotations

import json
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
IGNORE = -100


def config_values(model_dir: Path, output_dir: Path, **overrides) -> dict:
    values = {
        "model_name_or_path": str(model_dir), "stage": "sft", "finetuning_type": "full", "dataset": "demo_sft",
        "dataset_dir": str(REPO_ROOT / "data"), "output_dir": str(output_dir), "per_device_train_batch_size": 4,
        "learning_rate": 5e-3, "max_steps": 6, "logging_steps": 1, "save_steps": 1000, "seed": 7,
        "lr_scheduler_type": "constant", "pipeline_cache_dir": str(output_dir.parent / "cache"),
        "dataloader_num_workers": 0,
    }
    values.update(overrides)
    return values


def make_config(model_dir: Path, output_dir: Path, **overrides):
    from tuneline.config import load_config

    return load_config(None, config_values(model_dir, output_dir, **overrides), check_paths=False)


def write_config(path: Path, model_dir: Path, output_dir: Path, **overrides) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(config_values(model_dir, output_dir, **overrides)))
    return path


def _chat_ids(tokenizer, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    messages = [{"role": "user", "content": prompt}]
    prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "keys"):
        prompt_ids = prompt_ids["input_ids"]
    answer_ids = tokenizer(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
    return list(prompt_ids), list(answer_ids)


def sft_rows(tokenizer, count: int, offset: int = 0) -> dict[str, list]:
    rows = json.loads((REPO_ROOT / "data" / "demo_sft.json").read_text())[offset:offset + count]
    out = {"input_ids": [], "attention_mask": [], "labels": []}
    for row in rows:
        prompt, answer = _chat_ids(tokenizer, f"{row['instruction']}\n{row['input']}", row["output"])
        out["input_ids"].append(prompt + answer)
        out["attention_mask"].append([1] * (len(prompt) + len(answer)))
        out["labels"].append([IGNORE] * len(prompt) + answer)
    return out


def rm_rows(tokenizer, count: int, offset: int = 0) -> dict[str, list]:
    rows = json.loads((REPO_ROOT / "data" / "demo_pref.json").read_text())[offset:offset + count]
    out = {f"{side}_{col}": [] for side in ("chosen", "rejected") for col in ("input_ids", "attention_mask", "labels")}
    for row in rows:
        for side in ("chosen", "rejected"):
            prompt, answer = _chat_ids(tokenizer, f"{row['instruction']}\n{row['input']}", row[side])
            out[f"{side}_input_ids"].append(prompt + answer)
            out[f"{side}_attention_mask"].append([1] * (len(prompt) + len(answer)))
            out[f"{side}_labels"].append([IGNORE] * len(prompt) + answer)
    return out


def make_splits(tokenizer, stage: str = "sft", train: int = 32, validation: int = 8):
    from datasets import Dataset, DatasetDict

    build = rm_rows if stage == "rm" else sft_rows
    return DatasetDict({"train": Dataset.from_dict(build(tokenizer, train)),
                        "validation": Dataset.from_dict(build(tokenizer, validation, offset=train))})


def preference_trainer(trainer_class, config, policy, tokenizer, datasets, ref_model):
    """A dpo or kto trainer (config.stage) built as the stage builds it, with the reference model given (None:
    the rows carry precomputed reference log-probs)."""
    from functools import partial

    from tuneline.data import build_collator
    from tuneline.train.trainer_base import StageSpec, build_trainer

    spec = StageSpec(name=config.stage, trainer_class=partial(trainer_class, ref_model=ref_model))
    return build_trainer(config, spec, policy, tokenizer, datasets, build_collator(config.stage, tokenizer), [])


def preference_config(tmp_path: Path, model_dir: Path, cache_dir: Path, **values):
    """The dpo and kto tests' tiny run on the demo data (`values`: the stage, its dataset and sizes, and each
    test's changes): short rows, batches of 4, no checkpoint and no evaluation unless a test asks."""
    from tuneline.config import load_config

    base = {"model_name_or_path": str(model_dir), "dataset_dir": str(REPO_ROOT / "data"), "cutoff_len": 64,
            "output_dir": str(tmp_path / "out"), "pipeline_cache_dir": str(cache_dir),
            "per_device_train_batch_size": 4, "per_device_eval_batch_size": 8, "save_strategy": "no",
            "eval_strategy": "no", "seed": 0, "disable_tqdm": True}
    return load_config(overrides={**base, **values})


def trainer_log_entries(output_dir: Path) -> list[dict]:
    """Every line of a training's trainer_log.jsonl (a line that is not JSON fails the test)."""
    return [json.loads(line) for line in (Path(output_dir) / "trainer_log.jsonl").read_text().splitlines()]


def train_split_as_eval(ref: dict, folder: Path) -> dict:
    """The stored dataset with its train split also as the eval split, so evaluation before and after training
    measures what a preference stage optimises. (Held-out rows barely move on the randomly initialised tiny model:
    it has no language to generalise from, so held-out accuracy hovers at 0.55-0.7 and would make a flaky test.)"""
    from datasets import DatasetDict

    from tuneline.content.step_cache import cached_step
    from tuneline.data import load_processed

    train = load_processed(ref)["train"]
    return cached_step(folder, "test", "train-as-eval",
                       lambda out: DatasetDict({"train": train, "validation": train}).save_to_disk(str(out)) or {})


def live_and_stored_metrics(live, stored, policy, stored_column: str) -> list[dict]:
    """On training rows 0-3, then 4-11: a trainer with a live reference model (`live`) and one reading the rows'
    precomputed reference log-probs (`stored`, whose batches alone hold `stored_column`) give the same loss and
    metrics (1e-5). Returns the live metrics of each batch."""
    import pytest

    seen = []
    for rows in (range(0, 4), range(4, 12)):
        batch_live = live.data_collator([live.train_dataset[i] for i in rows])
        batch_stored = stored.data_collator([stored.train_dataset[i] for i in rows])
        assert stored_column in batch_stored and stored_column not in batch_live
        loss_live, metrics_live = live.batch_loss(policy, batch_live)
        loss_stored, metrics_stored = stored.batch_loss(policy, batch_stored)
        assert abs(loss_live.item() - loss_stored.item()) < 1e-5
        assert metrics_live.keys() == metrics_stored.keys()
        for name, value in metrics_live.items():
            assert metrics_stored[name] == pytest.approx(value, abs=1e-5), name
        seen.append(metrics_live)
    return seen


def nudge(model, scale=0.05):
    """Move the trainable weights so the policy differs from its reference."""
    import torch

    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=generator) * scale)


def grad_enabled_per_forward(config, trainer_class) -> list[bool]:
    """Whether gradients were on for each forward of the policy and of its live reference model, in order,
    during one `batch_loss` of `trainer_class` (dpo or kto) on four training rows."""
    import torch

    from tuneline.data import build_dataset, load_processed
    from tuneline.model import load_model, load_tokenizer
    from tuneline.reference import load_reference_model

    tokenizer = load_tokenizer(config.model)
    policy = load_model(config, tokenizer)
    trainer = preference_trainer(trainer_class, config, policy, tokenizer, load_processed(build_dataset(config)),
                                 load_reference_model(config, tokenizer))
    seen: list[bool] = []
    models = {id(m): m for m in (policy, trainer.ref_model) if m is not None}.values()
    hooks = [m.register_forward_hook(lambda *_: seen.append(torch.is_grad_enabled())) for m in models]
    try:
        trainer.batch_loss(policy, trainer.data_collator([trainer.train_dataset[i] for i in range(4)]))
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def train_step(config, dataset: dict, reference: dict | None, key: str, mlflow_run_id: str | None,
               tracking_uri: str | None, on_line=print):
    """What the train task does around Prefect: prepare the child, run it (unless a finished training stands),
    take the result. `dataset` and `reference` as the library's steps store them (their records' dict form)."""
    from tuneline.content.records import BuiltDataset, ReferenceLogps
    from tuneline.pipeline.launch import run_streaming
    from tuneline.pipeline.train_step import prepare_training

    launch = prepare_training(config, BuiltDataset.from_stored(dataset),
                              ReferenceLogps.from_stored(reference) if reference else None, key, mlflow_run_id,
                              tracking_uri, on_line=on_line)
    try:
        if launch.command:
            run_streaming(launch.command, launch.env, launch.forward)
        return launch.result()
    finally:
        launch.release()


# LLaMA-Factory's image demo data: mllm_demo (sft) as 0.9.5 ships it, and the rlhf_v pairs beside the media copy
MLLM_DATA = REPO_ROOT / "tests" / "fixtures" / "llamafactory" / "0.9.5" / "data"
MM_DATA = REPO_ROOT / "tests" / "fixtures" / "llamafactory-mm"


def scores_with_and_without_pixels(reward_model, config, tokenizer, train) -> tuple[dict, object, object]:
    """The rm batch of `train`'s first two pairs, and the reward model's scores of its halves with the pixels and
    with them zeroed."""
    import torch

    from tuneline.data import build_collator
    from tuneline.data.mm.run_media import dataset_media
    from tuneline.objectives.logps import MEDIA_INPUTS
    from tuneline.train.rm import pair_scores

    pairs = build_collator("rm", tokenizer, media=dataset_media(config, tokenizer, [train]))([train[0], train[1]])
    zeroed = {**pairs[MEDIA_INPUTS], "pixel_values": 0 * pairs[MEDIA_INPUTS]["pixel_values"]}
    with torch.no_grad():
        seen = torch.cat(pair_scores(reward_model, pairs))
        blind = torch.cat(pair_scores(reward_model, {**pairs, MEDIA_INPUTS: zeroed}))
    return pairs, seen, blind


def kto_image_data(folder: Path) -> Path:
    """`folder` made a dataset dir holding `kto_images`: each rlhf_v pair as two kto rows (the chosen answer
    desirable, the rejected not), with the pair's images."""
    pairs = json.loads((MM_DATA / "rlhf_v_demo.json").read_text())
    rows = [{"messages": [{"role": "user", "content": p["conversations"][0]["value"]},
                          {"role": "assistant", "content": p[side]["value"]}],
             "label": side == "chosen", "images": [str(MM_DATA / image) for image in p["images"]]}
            for p in pairs for side in ("chosen", "rejected")]
    folder.mkdir(parents=True)
    (folder / "kto_images.json").write_text(json.dumps(rows))
    (folder / "dataset_info.json").write_text(json.dumps({"kto_images": {
        "file_name": "kto_images.json", "formatting": "sharegpt",
        "columns": {"messages": "messages", "kto_tag": "label", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
    return folder
VLM_KEYS = {"finetuning_type": "lora", "lora_target": "all", "per_device_train_batch_size": 2, "max_steps": 2,
            "save_steps": 1}


def vlm_config(tiny_vlm, tmp_path: Path, preset: str, **keys):
    """A LoRA run of a few steps on a tiny vision-language preset, with its own template, into tmp_path/out."""
    return make_config(tiny_vlm(preset), tmp_path / "out", **{**VLM_KEYS, "template": preset, **keys})


def assert_pixels_reach_forward(config, tokenizer, media, rows, adapters) -> None:
    """The trained model's loss on a batch of `rows` changes when their pixels are zeroed: the images reach the
    forward, and the loss with them is finite."""
    import torch

    from tuneline.data import build_collator
    from tuneline.model import load_model

    model = load_model(config, tokenizer, is_trainable=False, adapters=str(adapters))
    inputs = build_collator("sft", tokenizer, media=media)(list(rows))
    with torch.no_grad():
        seen = model(**inputs).loss
        blind = model(**{**inputs, "pixel_values": inputs["pixel_values"] * 0}).loss
    assert torch.isfinite(seen) and not torch.isclose(seen, blind), "the pixels reach the forward"


class FirstBatch:
    """Keeps the first training batch, as the trainer's own DataLoader made it."""

    def __new__(cls):
        from transformers import TrainerCallback

        class Keeper(TrainerCallback):
            batch = None

            def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
                Keeper.batch = next(iter(train_dataloader))

        return Keeper()


def build(config, stage: str, tokenizer, splits=None):
    from transformers import set_seed

    from tuneline.data.collators import build_collator
    from tuneline.model.loader import load_model
    from tuneline.train import STAGE_MODULES
    from tuneline.train.callbacks import build_callbacks
    from tuneline.train.trainer_base import build_trainer

    spec = __import__(STAGE_MODULES[stage], fromlist=["SPEC"]).SPEC
    set_seed(config.training["seed"])  # as run_stage: a new head's weights must not depend on earlier tests
    splits = splits if splits is not None else make_splits(tokenizer, "rm" if stage == "rm" else "sft")
    model = load_model(config, tokenizer, is_trainable=True, add_valuehead=spec.add_valuehead)
    collator = build_collator(spec.name, tokenizer)
    callbacks = build_callbacks(config, config.output_dir)
    return build_trainer(config, spec, model, tokenizer, splits, collator, callbacks), spec


def step_losses(output_dir: Path) -> dict[int, float]:
    """The loss the child logged at each step (a resumed run's last record of a step wins)."""
    records = [json.loads(line) for line in (output_dir / "trainer_log.jsonl").read_text().splitlines()]
    return {r["current_steps"]: r["loss"] for r in records if "loss" in r}


def logged(output_dir, key="loss"):
    lines = [json.loads(line) for line in (output_dir / "trainer_log.jsonl").read_text().splitlines()]
    return [r[key] for r in lines if key in r]


# tiny presets named after their template whose model type differs (pixtral: LLaVA with a Pixtral tower)
PRESET_MODEL_TYPES = {"pixtral": "llava", "minicpm_v_4_6": "minicpmv4_6", "intern_vl": "internvl",
                      "glm4_5v": "glm4v_moe"}
