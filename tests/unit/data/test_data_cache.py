"""build_dataset: content-keyed cache (hit, miss on every input, half-written entries, overwrite_cache,
tokenized_path checks), splits and mixing, bad rows end to end, and a fingerprint that stays light."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from tests.support.data import write_dataset
from tuneline.data import build_dataset, dataset_fingerprint, load_processed
from tuneline.errors import DataError

ROWS = [{"instruction": f"question {i}", "output": f"answer {i}"} for i in range(10)]


@pytest.fixture
def data_dir(tmp_path):
    root = tmp_path / "data"
    write_dataset(root, "a", ROWS)
    write_dataset(root, "b", [{"instruction": f"other {i}", "output": "x"} for i in range(4)])
    return root


def test_build_then_hit(data_dir, make_config):
    config = make_config(dataset="a")
    ref = build_dataset(config)
    assert ref["cache_hit"] is False and ref["train_rows"] == 10 and ref["eval_rows"] == 0
    assert ref["stage"] == "sft" and ref["bad_rows"] == {}
    data = load_processed(ref)
    assert ref["tokens"] == sum(len(r) for r in data["train"]["input_ids"])
    start = time.perf_counter()
    again = build_dataset(config)
    assert time.perf_counter() - start < 1.0
    assert again["cache_hit"] is True and again["path"] == ref["path"] and again["fingerprint"] == ref["fingerprint"]
    assert json.loads(json.dumps(again)) == again


CHANGES = [
    {"template": "default"}, {"cutoff_len": 64}, {"train_on_prompt": True}, {"mask_history": True},
    {"packing": True}, {"val_size": 0.2}, {"max_samples": 5}, {"dataset": "a,b"},
    {"dataset": "a,b", "mix_strategy": "interleave_under"}, {"seed": 7}, {"default_system": "S"},
    {"tool_format": "qwen"}, {"stage": "ppo", "reward_model": "rm"}, {"eval_dataset": "b"},
    {"preprocessing_batch_size": 10},
    {"preprocessing_num_workers": 2}, {"enable_thinking": False}, {"preserve_thinking": True},
]


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: ",".join(c))
def test_every_option_changes_the_fingerprint(data_dir, make_config, change):
    base = {"dataset": "a"}
    assert dataset_fingerprint(make_config(**base)) != dataset_fingerprint(make_config(**{**base, **change}))


def test_data_entry_and_tokenizer_changes_miss(data_dir, tmp_path, make_config, char_tokenizer_dir):
    before = dataset_fingerprint(make_config(dataset="a"))
    write_dataset(data_dir, "a", ROWS[:-1])
    after_data = dataset_fingerprint(make_config(dataset="a"))
    write_dataset(data_dir, "a", ROWS[:-1], {"columns": {"response": "output"}})
    after_entry = dataset_fingerprint(make_config(dataset="a"))
    tok = tmp_path / "tok"
    shutil.copytree(char_tokenizer_dir, tok)
    same_tok = dataset_fingerprint(make_config(dataset="a", model_name_or_path=str(tok)))
    config_file = tok / "tokenizer_config.json"
    config_file.write_text(config_file.read_text().replace("}", ', "x": 1}', 1))
    other_tok = dataset_fingerprint(make_config(dataset="a", model_name_or_path=str(tok)))
    assert len({before, after_data, after_entry, other_tok}) == 4
    assert same_tok == after_entry


def test_half_written_entry_is_rebuilt_and_overwrite_cache(data_dir, make_config):
    config = make_config(dataset="a")
    key = dataset_fingerprint(config)
    partial = data_dir.parent / "cache" / "build-dataset" / key
    partial.mkdir(parents=True)
    (partial / "dataset_dict.json").write_text("{}")  # no COMPLETE marker: never trusted
    ref = build_dataset(config)
    assert ref["cache_hit"] is False and load_processed(ref)["train"].num_rows == 10
    assert build_dataset(make_config(dataset="a", overwrite_cache=True))["cache_hit"] is False
    assert build_dataset(config)["cache_hit"] is True


def test_tokenized_path_mismatch_says_what_changed(data_dir, tmp_path, make_config):
    where = str(tmp_path / "tokenized")
    ref = build_dataset(make_config(dataset="a", tokenized_path=where))
    assert ref["path"] == where
    assert build_dataset(make_config(dataset="a", tokenized_path=where))["cache_hit"] is True
    with pytest.raises(DataError, match=r"cutoff_len: 1024 -> 64"):
        build_dataset(make_config(dataset="a", tokenized_path=where, cutoff_len=64))
    rebuilt = build_dataset(make_config(dataset="a", tokenized_path=where, cutoff_len=64, overwrite_cache=True))
    assert rebuilt["cache_hit"] is False


def test_nothing_written_when_rows_are_bad(data_dir, tmp_path, make_config):
    write_dataset(data_dir, "bad", ROWS[:3] + [{"instruction": "q", "output": ""}])
    with pytest.raises(DataError, match="row 4, column 'output': empty response"):
        build_dataset(make_config(dataset="bad"))
    step = tmp_path / "cache" / "build-dataset"
    assert not step.exists() or not any(step.iterdir())
    ref = build_dataset(make_config(dataset="bad", on_bad_rows="skip"))
    assert ref["bad_rows"] == {"empty response": 1} and ref["train_rows"] == 3
    hit = build_dataset(make_config(dataset="bad", on_bad_rows="skip"))
    assert hit["cache_hit"] is True and hit["bad_rows"] == {"empty response": 1}  # the run can record them


def test_empty_after_filtering(data_dir, make_config):
    write_dataset(data_dir, "bad", [{"instruction": "q", "output": ""}])
    with pytest.raises(DataError, match="no usable rows"):
        build_dataset(make_config(dataset="bad", on_bad_rows="skip"))


def test_val_size_fraction_count_and_eval_dataset(data_dir, make_config):
    ref = build_dataset(make_config(dataset="a", val_size=0.2))
    assert (ref["train_rows"], ref["eval_rows"]) == (8, 2)
    split = load_processed(ref)
    assert set(split) == {"train", "validation"}
    assert build_dataset(make_config(dataset="a", val_size=3))["eval_rows"] == 3
    again = load_processed(build_dataset(make_config(dataset="a", val_size=0.2, overwrite_cache=True)))
    assert again["validation"]["input_ids"] == split["validation"]["input_ids"]  # seeded
    ref = build_dataset(make_config(dataset="a", eval_dataset="b"))
    assert (ref["train_rows"], ref["eval_rows"]) == (10, 4)


def test_mixing_concat_and_interleave(data_dir, make_config):
    assert build_dataset(make_config(dataset="a,b"))["train_rows"] == 14
    under = build_dataset(make_config(dataset="a,b", mix_strategy="interleave_under"))
    over = build_dataset(make_config(dataset="a,b", mix_strategy="interleave_over", interleave_probs="0.5,0.5"))
    assert under["train_rows"] < 14 < over["train_rows"]


PAIR_ENTRY = {"ranking": True, "columns": {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected"}}


def _preference_rows(stage: str, prompts: list[str], answer: str) -> tuple[list[dict], dict]:
    if stage == "kto":
        rows = [{"instruction": q, "output": answer, "label": i % 2 == 0} for i, q in enumerate(prompts)]
        return rows, {"columns": {"prompt": "instruction", "response": "output", "kto_tag": "label"}}
    return [{"instruction": q, "chosen": answer, "rejected": "n"} for q in prompts], PAIR_ENTRY


@pytest.mark.parametrize("stage", ["dpo", "rm", "kto"])
def test_long_prompts_are_cut_as_llamafactory_cuts_them_and_counted(tmp_path, make_config, stage):
    """The empty template: a 40-token prompt and a short answer within cutoff_len 32 keep the whole answer and
    the prompt's first tokens (LLaMA-Factory's infer_seqlen), and the row trains."""
    rows, entry = _preference_rows(stage, ["q", "p" * 40, "q"], "yes")
    write_dataset(tmp_path / "data", "p", rows, entry)
    ref = build_dataset(make_config(dataset="p", stage=stage, cutoff_len=32))
    assert ref["bad_rows"] == {} and ref["train_rows"] == 3 and ref["truncated_rows"] == 1
    train = load_processed(ref)["train"]
    assert not any(c.startswith("_") for c in train.column_names)
    prefix = "" if stage == "kto" else "chosen_"
    short, cut = train[0], train[1]
    assert len(cut[f"{prefix}input_ids"]) == 32 and len(short[f"{prefix}input_ids"]) < 32
    answer = [t for t in short[f"{prefix}labels"] if t != -100]
    assert [t for t in cut[f"{prefix}labels"] if t != -100] == answer, "the answer is kept whole"
    assert cut[f"{prefix}input_ids"][-len(answer):] == answer


@pytest.mark.parametrize("stage", ["dpo", "rm", "kto"])
def test_a_row_left_without_a_response_token_is_a_bad_row(tmp_path, make_config, stage):
    """Only a prompt so long that the cut leaves no response token (700 prompt and 21 answer tokens in 32: the
    answer's share, 32 x 21 / 721, rounds down to 0) is unusable: reported with file and row, dropped with skip."""
    rows, entry = _preference_rows(stage, ["q", "p" * 700, "q"], "y" * 20)
    path = write_dataset(tmp_path / "data", "p", rows, entry)
    config = {"dataset": "p", "stage": stage, "cutoff_len": 32}
    with pytest.raises(DataError, match=f"{path}: row 2: no room for a response: the prompt is 700 tokens"):
        build_dataset(make_config(**config))
    step = tmp_path / "cache" / "build-dataset"
    assert not step.exists() or not any(step.iterdir())
    ref = build_dataset(make_config(**config, on_bad_rows="skip"))
    assert ref["bad_rows"] == {"no room for a response": 1} and ref["train_rows"] == 2


def test_sft_rows_cut_to_cutoff_len_are_counted(tmp_path, make_config):
    rows = [{"instruction": "q", "output": "a"}, {"instruction": "q" * 40, "output": "a" * 40}]
    write_dataset(tmp_path / "data", "s", rows, {})
    ref = build_dataset(make_config(dataset="s", stage="sft", cutoff_len=32))
    assert ref["truncated_rows"] == 1 and ref["bad_rows"] == {}
    assert max(len(ids) for ids in load_processed(ref)["train"]["input_ids"]) == 32


def test_empty_after_dropping_rows_without_room(tmp_path, make_config):
    write_dataset(tmp_path / "data", "p", [{"instruction": "p" * 700, "chosen": "y" * 20, "rejected": "n" * 20}],
                  PAIR_ENTRY)
    with pytest.raises(DataError, match=r"empty after encoding .*no room for a response': 1"):
        build_dataset(make_config(dataset="p", stage="dpo", cutoff_len=32, on_bad_rows="skip"))


def test_interleave_probs_must_match_the_datasets(data_dir, make_config):
    from tuneline.errors import ConfigError

    with pytest.raises(ConfigError, match="needs 2 numbers"):
        build_dataset(make_config(dataset="a,b", mix_strategy="interleave_under", interleave_probs="0.2,0.3,0.5"))


def test_with_lengths_gives_group_by_length_the_longest_side(tmp_path, make_config):
    from tuneline.data import with_lengths

    rows = [{"instruction": "q", "chosen": "a" * n, "rejected": "b" * (9 - n)} for n in (1, 5, 8)]
    write_dataset(tmp_path / "data", "p", rows, PAIR_ENTRY)
    train = load_processed(build_dataset(make_config(dataset="p", stage="dpo", template="empty")))["train"]
    lengths = with_lengths(train)["length"]
    assert list(lengths) == [1 + 8, 1 + 5, 1 + 8]  # "q" plus the longer answer
    assert list(with_lengths(train.select([1, 0]))["length"]) == [6, 9]  # a view over selected rows


def test_preview_flags_rows_that_training_would_drop(tmp_path, make_config):
    from tuneline.data import preview

    rows = [{"instruction": "q", "chosen": "yes", "rejected": "no"},
            {"instruction": "p" * 700, "chosen": "y" * 20, "rejected": "n" * 20}]
    write_dataset(tmp_path / "data", "p", rows, PAIR_ENTRY)
    text = preview(make_config(dataset="p", stage="dpo", cutoff_len=32), n=2)
    assert "--- example 2 (dpo)" in text and text.count("bad row") == 1
    assert "no room for a response: the prompt is 700 tokens" in text.split("--- example 2")[1]
