"""Registry, file types and format conversion (alpaca, sharegpt, ranking, kto), and every bad-input case."""

from __future__ import annotations

import json

import pytest

from tests.support.data import write_dataset
from tuneline.data.loader import load_examples
from tuneline.errors import DataError

ALPACA = [{"instruction": "Add", "input": "1 and 2", "output": "3", "system": "Be exact.",
           "history": [["hi", "hello"]]}]
ALPACA_ENTRY = {"columns": {"prompt": "instruction", "query": "input", "response": "output", "system": "system",
                            "history": "history"}}
PAIR_ENTRY = {"ranking": True, "columns": {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected"}}
KTO_ENTRY = {"columns": {"prompt": "instruction", "response": "output", "kto_tag": "label"}}
SHAREGPT_ENTRY = {"formatting": "sharegpt", "columns": {"messages": "conversations", "system": "system",
                                                       "tools": "tools"}}


def examples(make_config, name, stage="sft", **kw):
    config = make_config(dataset=name, stage=stage, **kw)
    return load_examples(config, config.dataset_names)


def only(loaded):
    assert not loaded.bad, [b.message() for b in loaded.bad]
    return loaded.per_dataset[0]


def test_alpaca_with_history_system_and_query(tmp_path, make_config):
    write_dataset(tmp_path / "data", "a", ALPACA, ALPACA_ENTRY)
    (ex,) = only(examples(make_config, "a"))
    assert ex["_prompt"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                             {"role": "user", "content": "Add\n1 and 2"}]
    assert ex["_response"] == [{"role": "assistant", "content": "3"}]
    assert ex["_system"] == "Be exact."


def test_listed_columns_replace_the_defaults_as_in_llamafactory(tmp_path, make_config):
    row = {"instruction": "Add", "input": "1 and 2", "output": "3", "question": "Q", "answer": "A"}
    root = tmp_path / "data"
    write_dataset(root, "defaults", [row])
    write_dataset(root, "listed", [row], {"columns": {"prompt": "instruction", "response": "output"}})
    write_dataset(root, "renamed", [row], {"columns": {"prompt": "question", "response": "answer"}})
    write_dataset(root, "no_response", [row], {"columns": {"prompt": "instruction", "query": "input"}})
    assert only(examples(make_config, "defaults"))[0]["_prompt"] == [{"role": "user", "content": "Add\n1 and 2"}]
    assert only(examples(make_config, "listed"))[0]["_prompt"] == [{"role": "user", "content": "Add"}]
    (renamed,) = only(examples(make_config, "renamed"))
    assert (renamed["_prompt"][0]["content"], renamed["_response"][0]["content"]) == ("Q", "A")
    with pytest.raises(DataError, match=r"stage 'sft' needs columns \['response'\]"):
        examples(make_config, "no_response")
    assert examples(make_config, "no_response", stage="ppo", reward_model="rm").per_dataset[0][0]["_response"] == []


def test_sharegpt_with_system_turn_tools_and_function_calls(tmp_path, make_config):
    conv = [{"from": "system", "value": "S"}, {"from": "human", "value": "1+1?"},
            {"from": "function_call", "value": '{"name": "add", "arguments": {}}'},
            {"from": "observation", "value": "2"}, {"from": "gpt", "value": "It is 2."}]
    write_dataset(tmp_path / "data", "s", [{"conversations": conv, "tools": [{"name": "add"}]}], SHAREGPT_ENTRY)
    (ex,) = only(examples(make_config, "s"))
    assert [m["role"] for m in ex["_prompt"]] == ["user", "function", "observation"]
    assert ex["_response"] == [{"role": "assistant", "content": "It is 2."}]
    assert ex["_system"] == "S" and json.loads(ex["_tools"]) == [{"name": "add"}]


def test_custom_sharegpt_tags(tmp_path, make_config):
    entry = {"formatting": "sharegpt", "columns": {"messages": "messages"},
             "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}
    rows = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]
    write_dataset(tmp_path / "data", "m", rows, entry)
    assert only(examples(make_config, "m"))[0]["_response"] == [{"role": "assistant", "content": "a"}]


def test_ranking_in_both_formats(tmp_path, make_config):
    root = tmp_path / "data"
    write_dataset(root, "ra", [{"instruction": "q", "chosen": "good", "rejected": "bad"}], PAIR_ENTRY)
    write_dataset(root, "rs", [{"conversations": [{"from": "human", "value": "q"}],
                                "chosen": {"from": "gpt", "value": "good"},
                                "rejected": {"from": "gpt", "value": "bad"}}],
                  {"ranking": True, "formatting": "sharegpt",
                   "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}})
    for name in ("ra", "rs"):
        (ex,) = only(examples(make_config, name, stage="dpo"))
        assert [m["content"] for m in ex["_response"]] == ["good", "bad"]
        assert ex["_prompt"] == [{"role": "user", "content": "q"}]


def test_kto_tag(tmp_path, make_config):
    write_dataset(tmp_path / "data", "k", [{"instruction": "q", "output": "a", "label": False}],
                  KTO_ENTRY)
    assert only(examples(make_config, "k", stage="kto"))[0]["_kto_tag"] is False


def test_stage_and_entry_mismatch(tmp_path, make_config):
    write_dataset(tmp_path / "data", "a", ALPACA)
    with pytest.raises(DataError, match="ranking"):
        examples(make_config, "a", stage="dpo")
    with pytest.raises(DataError, match="kto_tag"):
        examples(make_config, "a", stage="kto")


@pytest.mark.parametrize("suffix", ["json", "jsonl", "csv", "parquet"])
def test_file_types(tmp_path, make_config, suffix):
    rows = [{"instruction": "q1", "output": "a1"}, {"instruction": "q2", "output": "a2"}]
    root = tmp_path / "data"
    root.mkdir()
    path = root / f"f.{suffix}"
    if suffix == "json":
        path.write_text(json.dumps(rows))
    elif suffix == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows))
    elif suffix == "csv":
        path.write_text("instruction,output\nq1,a1\nq2,a2\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    write_dataset(root, "f", path.read_bytes(), file_name=path.name)
    got = only(examples(make_config, "f"))
    assert [e["_response"][0]["content"] for e in got] == ["a1", "a2"]


def test_txt_and_folder_for_pt(tmp_path, make_config):
    root = tmp_path / "data"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.txt").write_text("first doc\n\nsecond doc\n")
    (root / "docs" / "b.txt").write_text("third doc\n")
    (root / "dataset_info.json").write_text(json.dumps({"d": {"file_name": "docs", "columns": {"prompt": "text"}}}))
    got = only(examples(make_config, "d", stage="pt"))
    assert [e["_prompt"][0]["content"] for e in got] == ["first doc", "second doc", "third doc"]


def test_saved_datasets_folder_via_hf_hub_url(tmp_path, make_config):
    from datasets import Dataset

    root = tmp_path / "data"
    root.mkdir()
    Dataset.from_list([{"instruction": "q", "output": "a"}]).save_to_disk(str(root / "saved"))
    info = {"hub": {"hf_hub_url": "saved"}}
    (root / "dataset_info.json").write_text(json.dumps(info))
    assert only(examples(make_config, "hub"))[0]["_response"][0]["content"] == "a"


def test_unknown_dataset_offers_the_closest_name(tmp_path, make_config):
    write_dataset(tmp_path / "data", "alpaca_demo", ALPACA)
    with pytest.raises(DataError, match="did you mean 'alpaca_demo'"):
        examples(make_config, "alpaca_dem")


def test_missing_file(tmp_path, make_config):
    write_dataset(tmp_path / "data", "a", ALPACA)
    (tmp_path / "data" / "a.json").unlink()
    with pytest.raises(DataError, match="does not exist"):
        examples(make_config, "a")


BAD_ALPACA = [
    ({"input": "x", "output": "y"}, "missing column", "instruction"),
    ({"instruction": "q", "output": None}, "missing column", "output"),
    ({"instruction": 5, "output": "y"}, "wrong type", "instruction"),
    ({"instruction": "q", "output": "  "}, "empty response", "output"),
    ({"instruction": "q", "output": ["y"]}, "wrong type", "output"),
]


@pytest.mark.parametrize(("row", "reason", "column"), BAD_ALPACA)
def test_bad_alpaca_rows_are_named(tmp_path, make_config, row, reason, column):
    from tuneline.data.loader import handle_bad_rows

    path = write_dataset(tmp_path / "data", "a", [{"instruction": "ok", "output": "ok"}, row])
    loaded = examples(make_config, "a")
    with pytest.raises(DataError) as info:
        handle_bad_rows(loaded.bad, "stop")
    assert f"{path}: row 2, column '{column}': {reason}" in str(info.value)
    assert handle_bad_rows(loaded.bad, "skip") == {reason: 1}


def test_roles_out_of_order(tmp_path, make_config):
    conv = [{"from": "human", "value": "q"}, {"from": "human", "value": "again"}]
    write_dataset(tmp_path / "data", "s", [{"conversations": conv}], SHAREGPT_ENTRY)
    (bad,) = examples(make_config, "s").bad
    assert (bad.reason, bad.column, bad.row) == ("roles out of order", "conversations", 1)


def test_not_json_and_invalid_utf8_lines(tmp_path, make_config):
    good = json.dumps({"instruction": "q", "output": "a"}).encode()
    broken = b'{"instruction": "q", "output": "a"'
    latin = '{"instruction": "caf\xe9", "output": "a"}'.encode("latin-1")
    write_dataset(tmp_path / "data", "j", b"\n".join([good, broken, latin]) + b"\n", file_name="j.jsonl")
    loaded = examples(make_config, "j")
    assert [(b.row, b.reason) for b in loaded.bad] == [(2, "not JSON"), (3, "invalid UTF-8")]
    assert len(loaded.per_dataset[0]) == 1


def test_stop_message_counts_the_other_bad_rows(tmp_path, make_config):
    from tuneline.data.loader import bad_row_error

    rows = [{"instruction": "q", "output": ""}, {"instruction": "q"}, {"instruction": "q", "output": ""}]
    write_dataset(tmp_path / "data", "a", rows)
    message = str(bad_row_error(examples(make_config, "a").bad))
    assert "row 1, column 'output': empty response" in message
    assert "2 other bad rows: " in message and "empty response 1" in message and "missing column 1" in message
    assert "on_bad_rows: skip" in message


def test_max_and_num_samples(tmp_path, make_config):
    rows = [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(10)]
    write_dataset(tmp_path / "data", "a", rows)
    assert len(only(examples(make_config, "a", max_samples=3))) == 3
    write_dataset(tmp_path / "data", "n", rows, {"num_samples": 14})
    got = only(examples(make_config, "n"))
    assert len(got) == 14 and len({e["_response"][0]["content"] for e in got}) == 10


HUB_README = """---
configs:
- config_name: easy
  data_files:
  - split: train
    path: easy/train.jsonl
  - split: test
    path: easy/test.jsonl
- config_name: hard
  data_files:
  - split: train
    path: hard/train.jsonl
---
"""


def test_hf_hub_url_loads_a_local_dataset_repository_by_subset_and_split(tmp_path, make_config):
    """The `load_dataset` path of hf_hub_url, on a local repository folder (no hub is reachable here)."""
    root = tmp_path / "data"
    repo = root / "repo"
    for part, answers in (("easy/train", ["e1", "e2"]), ("easy/test", ["t1"]), ("hard/train", ["h1"])):
        (repo / part).parent.mkdir(parents=True, exist_ok=True)
        (repo / f"{part}.jsonl").write_text("".join(json.dumps({"instruction": "q", "output": a}) + "\n"
                                                    for a in answers))
    (repo / "README.md").write_text(HUB_README)
    (root / "dataset_info.json").write_text(json.dumps({
        "easy_test": {"hf_hub_url": "repo", "subset": "easy", "split": "test"},
        "hard": {"hf_hub_url": "repo", "subset": "hard"},
        "nosplit": {"hf_hub_url": "repo", "subset": "hard", "split": "validation"},
    }))
    cache = str(tmp_path / "hf-cache")

    def answers(name):
        return [e["_response"][0]["content"] for e in only(examples(make_config, name, cache_dir=cache))]

    assert answers("easy_test") == ["t1"]
    assert answers("hard") == ["h1"]
    with pytest.raises(DataError, match="cannot load hub dataset .*split 'validation'"):
        examples(make_config, "nosplit", cache_dir=cache)


@pytest.mark.parametrize("suffix", ["json", "csv"])
def test_invalid_utf8_in_json_array_and_csv(tmp_path, make_config, suffix):
    if suffix == "json":
        raw = b'[{"instruction": "q", "output": "a"}, {"instruction": "caf\xe9", "output": "a"}]'
    else:
        raw = b"instruction,output\nq,a\ncaf\xe9,a\n"
    path = write_dataset(tmp_path / "data", "u", raw, file_name=f"u.{suffix}")
    loaded = examples(make_config, "u")
    assert [(b.file, b.row, b.reason) for b in loaded.bad] == [(str(path), 2, "invalid UTF-8")]
    assert len(loaded.per_dataset[0]) == 1


BAD_PAIRS = [
    ({"instruction": "q", "chosen": "", "rejected": "no"}, "empty response", "chosen"),
    ({"instruction": "q", "chosen": "yes", "rejected": " "}, "empty response", "rejected"),
    ({"instruction": "q", "chosen": "same", "rejected": "same"}, "chosen equals rejected", "rejected"),
    ({"instruction": "q", "chosen": "yes"}, "missing column", "rejected"),
]


@pytest.mark.parametrize(("row", "reason", "column"), BAD_PAIRS)
def test_bad_alpaca_pairs(tmp_path, make_config, row, reason, column):
    from tuneline.data.loader import handle_bad_rows

    good = {"instruction": "q", "chosen": "yes", "rejected": "no"}
    path = write_dataset(tmp_path / "data", "p", [good, row, good], PAIR_ENTRY)
    loaded = examples(make_config, "p", stage="dpo")
    assert len(loaded.per_dataset[0]) == 2
    with pytest.raises(DataError, match=f"{path}: row 2, column '{column}': {reason}"):
        handle_bad_rows(loaded.bad, "stop")
    assert handle_bad_rows(loaded.bad, "skip") == {reason: 1}


def test_bad_sharegpt_pairs(tmp_path, make_config):
    def pair(chosen, rejected):
        return {"conversations": [{"from": "human", "value": "q"}],
                "chosen": {"from": "gpt", "value": chosen}, "rejected": {"from": "gpt", "value": rejected}}

    rows = [pair("yes", "no"), pair("", "no"), pair("yes", ""), pair("same", "same"),
            {**pair("yes", "no"), "rejected": {"from": "human", "value": "no"}}]
    entry = {"ranking": True, "formatting": "sharegpt",
             "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}}
    write_dataset(tmp_path / "data", "ps", rows, entry)
    loaded = examples(make_config, "ps", stage="rm")
    assert len(loaded.per_dataset[0]) == 1
    assert [(b.row, b.column, b.reason) for b in loaded.bad] == [
        (2, "chosen", "empty response"), (3, "rejected", "empty response"), (4, "rejected", "chosen equals rejected"),
        (5, "rejected", "roles out of order")]


def test_kto_rows_need_a_boolean_label(tmp_path, make_config):
    rows = [{"instruction": "q", "output": "a", "label": True}, {"instruction": "q", "output": "a"},
            {"instruction": "q", "output": "a", "label": "yes"}, {"instruction": "q", "output": "a", "label": None}]
    write_dataset(tmp_path / "data", "k", rows, KTO_ENTRY)
    loaded = examples(make_config, "k", stage="kto")
    assert [e["_kto_tag"] for e in loaded.per_dataset[0]] == [True]
    assert [(b.row, b.column, b.reason) for b in loaded.bad] == [
        (2, "label", "missing column"), (3, "label", "wrong type"), (4, "label", "missing column")]
    assert "expected bool, got str" in loaded.bad[1].message()


def test_examples_remember_their_file_and_row(tmp_path, make_config):
    path = write_dataset(tmp_path / "data", "a", [{"instruction": "q1", "output": "a"}, {"instruction": "q2"},
                                                  {"instruction": "q3", "output": "a"}])
    got = examples(make_config, "a").per_dataset[0]
    assert [(e["_file"], e["_row"]) for e in got] == [(str(path), 1), (str(path), 3)]


def test_every_key_of_a_dataset_info_entry_is_honoured_or_refused():
    """A typo is not read as the default ('formating: sharegpt' would have loaded as alpaca), and a key tuneline
    does not implement is named with what to do instead; LLaMA-Factory's unchecked file_sha1 passes."""
    from tuneline.data.registry import parse_entry
    from tuneline.errors import DataError

    with pytest.raises(DataError, match="dataset 'd': unknown key 'formating'; did you mean 'formatting'"):
        parse_entry("d", {"file_name": "a.json", "formating": "sharegpt"})
    with pytest.raises(DataError, match="dataset 'd': 'folder' is not supported: use 'subset'"):
        parse_entry("d", {"hf_hub_url": "org/data", "folder": "part"})
    assert parse_entry("d", {"file_name": "a.json", "file_sha1": "abc", "formatting": "sharegpt"}).formatting == "sharegpt"
