"""build-reference-model computes only the rows a run visits, keeps them per row, extends them for a longer run, and
runs on the training's device: the plan matches what the Trainer (and accelerate's sharding) really visit, partial
and full precomputes agree, and training on a partial reference gives the losses of a full one."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import pytest
import torch

from tuneline.config import load_config
from tuneline.data import build_dataset, load_processed
from tuneline.errors import UserError
from tuneline.reference import build_reference_logps, reference_fingerprint, row_store
from tuneline.reference.compute import batches_by_length, reference_device, usable_cores
from tuneline.reference.rows import visit_plan, visited_rows
from tuneline.reference.store import RowStore

DATA = Path(__file__).resolve().parents[3] / "data"
TRAIN_ROWS = 48  # demo_pref, max_samples 64, val_size 16


def make_config(tmp_path, model_dir, cache: str = "cache", **overrides):
    values = {"model_name_or_path": str(model_dir), "stage": "dpo", "dataset": "demo_pref",
              "dataset_dir": str(DATA), "cutoff_len": 64, "max_samples": 64, "val_size": 16,
              "output_dir": str(tmp_path / "out"), "pipeline_cache_dir": str(tmp_path / cache),
              "per_device_train_batch_size": 4, "per_device_eval_batch_size": 8, "save_strategy": "no",
              "eval_strategy": "no", "logging_steps": 1, "seed": 3, "disable_tqdm": True, "max_steps": 3,
              "learning_rate": 5e-3, "lr_scheduler_type": "constant", "dataloader_num_workers": 0, **overrides}
    return load_config(overrides=values)


def train_values(ref: dict, column: str = "ref_chosen_logps") -> list[float]:
    return load_processed(ref)["train"][column]


@pytest.mark.parametrize(("overrides", "expected"), [
    ({}, {"rows": 12, "order": "random", "seed": 3}),
    ({"gradient_accumulation_steps": 2, "data_seed": 11}, {"rows": 24, "order": "random", "seed": 11}),
    ({"num_processes": 2, "use_cpu": True}, {"rows": 24, "order": "random", "seed": 3}),
    ({"disable_shuffling": True}, {"rows": 12, "order": "sequential"}),
    ({"max_steps": -1, "num_train_epochs": 0.1}, {"rows": "all"}),  # epoch-based: every row
    ({"group_by_length": True}, {"rows": "all"}),  # its order comes from the global RNG: not foreseen
    ({"train_sampling_strategy": "group_by_length"}, {"rows": "all"}),
    ({"accelerator_config": {"split_batches": True}}, {"rows": "all"}),
])
def test_visit_plan(tmp_path, overrides, expected):
    assert visit_plan(make_config(tmp_path, tmp_path, **overrides)) == expected


def test_the_plan_is_what_the_trainer_and_accelerate_shards_visit(tmp_path, tiny_model_dir):
    """The Trainer's own train dataloader (one process), and accelerate's two-process shards of the same sampler,
    visit exactly the planned rows in the first max_steps x accumulation batches."""
    from accelerate.data_loader import prepare_data_loader
    from datasets import Dataset

    from tuneline.model import load_model, load_tokenizer
    from tuneline.train.dpo import DPOTrainer
    from tuneline.train.trainer_base import StageSpec, build_trainer

    rows = Dataset.from_dict({"row": list(range(TRAIN_ROWS))})
    config = make_config(tmp_path, tiny_model_dir, gradient_accumulation_steps=2, max_steps=2)
    tokenizer = load_tokenizer(config.model)
    trainer = build_trainer(config, StageSpec("dpo", DPOTrainer), load_model(config, tokenizer), tokenizer,
                            {"train": rows}, lambda features: {"row": torch.tensor([f["row"] for f in features])}, [])
    batches = iter(trainer.get_train_dataloader())
    seen = [row for _ in range(2 * 2) for row in next(batches)["row"].tolist()]
    assert seen == visited_rows(visit_plan(config), TRAIN_ROWS)

    two = make_config(tmp_path, tiny_model_dir, num_processes=2, use_cpu=True, max_steps=2)
    torch.manual_seed(3)  # as the Trainer's set_seed(seed) before it builds its dataloader
    loader = torch.utils.data.DataLoader(list(range(TRAIN_ROWS)), batch_size=4, shuffle=True)
    shards = [prepare_data_loader(loader, num_processes=2, process_index=i, put_on_device=False,
                                  use_seedable_sampler=True) for i in range(2)]
    union = {row for shard in shards for batch, _ in zip(shard, range(2), strict=False) for row in batch.tolist()}
    assert union == set(visited_rows(visit_plan(two), TRAIN_ROWS))


def test_partial_precompute_equals_full_on_the_rows_used(tmp_path, tiny_model_dir):
    config = make_config(tmp_path, tiny_model_dir)
    data = build_dataset(config)
    partial = build_reference_logps(config, data)
    full = build_reference_logps(make_config(tmp_path, tiny_model_dir, "cache-full", max_steps=-1), data)
    used = visited_rows(visit_plan(config), TRAIN_ROWS)
    assert partial["computed_rows"] == 12 + 16 and full["computed_rows"] == TRAIN_ROWS + 16
    assert partial["visited_rows"] == {"train": 12, "validation": 16}
    for column in ("ref_chosen_logps", "ref_rejected_logps"):
        some, every = train_values(partial, column), train_values(full, column)
        # other rows in a batch, other padding: the sum of ~100 float32 log-probs may move by an ulp or two
        assert [some[i] for i in used] == pytest.approx([every[i] for i in used], rel=1e-6)
        assert all(math.isnan(some[i]) for i in set(range(TRAIN_ROWS)) - set(used))
    evaluation = [load_processed(ref)["validation"]["ref_chosen_logps"] for ref in (partial, full)]
    assert evaluation[0] == pytest.approx(evaluation[1], abs=1e-6)  # the evaluation reads every row


def test_a_longer_run_extends_the_stored_rows(tmp_path, tiny_model_dir):
    short = make_config(tmp_path, tiny_model_dir)
    data = build_dataset(short)
    first = build_reference_logps(short, data)
    longer = make_config(tmp_path, tiny_model_dir, max_steps=6)
    second = build_reference_logps(longer, data)
    assert second["fingerprint"] != first["fingerprint"] and second["path"] != first["path"], "rows changed: new key"
    assert second["computed_rows"] == 12, "only the rows the shorter run did not visit"
    assert reference_fingerprint(longer, data["fingerprint"]) == second["fingerprint"]
    kept = visited_rows(visit_plan(short), TRAIN_ROWS)
    assert [train_values(second)[i] for i in kept] == [train_values(first)[i] for i in kept]
    every = build_reference_logps(make_config(tmp_path, tiny_model_dir, max_steps=-1), data)
    assert every["computed_rows"] == TRAIN_ROWS - 24 and not any(map(math.isnan, train_values(every)))
    again = build_reference_logps(make_config(tmp_path, tiny_model_dir, max_steps=-1, pref_beta=0.5), data)
    assert again["cache_hit"] and again["path"] == every["path"]


def test_training_on_a_partial_reference_gives_the_losses_of_a_full_one(tmp_path, tiny_model_dir):
    from tuneline.train.dpo import run

    config = make_config(tmp_path, tiny_model_dir)
    data = build_dataset(config)
    partial = build_reference_logps(config, data)
    full = build_reference_logps(make_config(tmp_path, tiny_model_dir, "cache-full", max_steps=-1), data)
    assert partial["computed_rows"] < full["computed_rows"]
    losses = []
    for name, ref in (("partial", partial), ("full", full)):
        run(make_config(tmp_path, tiny_model_dir, output_dir=str(tmp_path / name)), ref, [])
        log = [json.loads(line) for line in (tmp_path / name / "trainer_log.jsonl").read_text().splitlines()]
        losses.append([entry["loss"] for entry in log if "loss" in entry])
    assert len(losses[0]) == 3 and losses[0] == pytest.approx(losses[1], abs=1e-6)

    # A run visiting rows the reference does not hold stops with a message instead of training on NaN.
    more = make_config(tmp_path, tiny_model_dir, max_steps=12, output_dir=str(tmp_path / "more"))
    with pytest.raises(UserError, match="no precomputed 'ref_chosen_logps'.*tuneline train CONFIG"):
        run(more, partial, [])


def test_unreadable_shard_is_set_aside_and_its_rows_computed_again(tmp_path, tiny_model_dir, caplog):
    config = make_config(tmp_path, tiny_model_dir)
    data = build_dataset(config)
    first = build_reference_logps(config, data)
    (shard,) = row_store(config).folder.glob("shard-*.npz")
    shard.write_bytes(shard.read_bytes()[:100])  # cut off, as by a full disk
    shutil.rmtree(first["path"])  # the step's own entry gone too: it builds again from the row store
    with caplog.at_level(logging.WARNING, logger="tuneline"):
        again = build_reference_logps(config, data)
    assert shard.name in caplog.text and not shard.exists()
    assert (shard.parent / f"{shard.name}.unreadable").is_file()
    assert again["computed_rows"] == 12 + 16 and again["fingerprint"] == first["fingerprint"]
    assert all(a == b or math.isnan(a) and math.isnan(b)
               for a, b in zip(train_values(again), train_values(first), strict=True))


def test_row_store_round_trip(tmp_path):
    store = RowStore(tmp_path / "rows", ("a", "b"))
    rows = {bytes([i]) * 32: (float(i), -0.1 * i) for i in range(5)}
    store.add(rows)
    store.add({bytes([9]) * 32: (1.5, 2.5)})
    assert store.load() == {**rows, bytes([9]) * 32: (1.5, 2.5)}
    assert not list((tmp_path / "rows").glob(".tmp-*")), "no temporary file left"


def test_the_precompute_runs_on_every_core_and_gives_them_back(tmp_path, tiny_model_dir):
    config = make_config(tmp_path, tiny_model_dir)
    before = torch.get_num_threads()
    ref = build_reference_logps(config, build_dataset(config))
    assert ref["device"] == "cpu" and ref["threads"] == usable_cores()
    assert torch.get_num_threads() == before


def test_batches_by_length_group_similar_sequences_longest_first():
    assert batches_by_length([5, 50, 7, 49, 1, 7], 2) == [[1, 3], [2, 5], [0, 4]]


@pytest.mark.parametrize(("cuda", "use_cpu", "expected"), [(True, False, "cuda"), (True, True, "cpu"),
                                                           (False, False, "cpu")])
def test_reference_device_follows_the_training(tmp_path, monkeypatch, cuda, use_cpu, expected):
    """No GPU exists on the machines these tests run on: torch.cuda.is_available is replaced to say there is one."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    overrides = {"use_cpu": True} if use_cpu else {}
    assert reference_device(make_config(tmp_path, tmp_path, **overrides)).type == expected
