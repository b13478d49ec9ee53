"""Registry, file types and format conversion (alpaca, sharegpt, ranking, kto), and every bad-input case."""

from __future__ import annotations

import json

import pytest
from conftest import write_dataset

from tuneline.data.loader import load_examples
from tuneline.errors import DataError

ALPACA = [{"instruction": "Add", "input": "1 and 2", "output": "3", "system": "Be exact.",
           "history": [["hi", "hello"]]}]
ALPACA_ENTRY = {"columns": {"system": "system", "history": "history"}}
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
    write_dataset(root, "ra", [{"instruction": "q", "chosen": "good", "rejected": "bad"}],
                  {"ranking": True, "columns": {"chosen": "chosen", "rejected": "rejected"}})
    write_dataset(root, "rs", [{"conversations": [{"from": "human", "value": "q"}],
                                "chosen": {"from": "gpt", "value": "good"}, "rejected": {"from": "gpt", "value": "bad"}}],
                  {"ranking": True, "formatting": "sharegpt", "columns": {"chosen": "chosen", "rejected": "rejected"}})
    for name in ("ra", "rs"):
        (ex,) = only(examples(make_config, name, stage="dpo"))
        assert [m["content"] for m in ex["_response"]] == ["good", "bad"]
        assert ex["_prompt"] == [{"role": "user", "content": "q"}]


def test_kto_tag(tmp_path, make_config):
    write_dataset(tmp_path / "data", "k", [{"instruction": "q", "output": "a", "label": False}],
                  {"columns": {"kto_tag": "label"}})
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
