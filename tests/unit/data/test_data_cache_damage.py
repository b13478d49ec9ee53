"""A built dataset entry damaged after it was stored (a truncated Arrow file) is detected before use, set aside
with a warning naming the file, and rebuilt; the step's completeness check (which decides whether Prefect's cache
record is trusted) says it is not complete."""

from __future__ import annotations

import logging
import os

from tests.support.data import write_dataset
from tuneline.data import build_dataset, load_processed
from tuneline.pipeline.cache_checks import dataset_complete


def test_a_truncated_arrow_file_is_set_aside_and_the_entry_rebuilt(tmp_path, make_config, caplog):
    write_dataset(tmp_path / "data", "a", [{"instruction": f"question {i}", "output": f"answer {i}"}
                                           for i in range(10)])
    config = make_config(dataset="a")
    ref = build_dataset(config)
    assert dataset_complete(config, ref["fingerprint"])
    [arrow] = (tmp_path / "cache" / "build-dataset" / ref["fingerprint"] / "train").glob("*.arrow")
    os.truncate(arrow, os.path.getsize(arrow) // 2)

    with caplog.at_level(logging.WARNING, logger="tuneline.content.step_cache"):
        assert not dataset_complete(config, ref["fingerprint"])
    assert "data-00000-of-00001.arrow does not read" in caplog.text and ".damaged-" in caplog.text
    again = build_dataset(config)
    assert again["cache_hit"] is False and again["path"] == ref["path"]
    assert load_processed(again)["train"].num_rows == 10
    [aside] = [p for p in os.scandir(os.path.dirname(ref["path"])) if p.name.startswith(".damaged-")]
    assert os.path.isdir(aside.path), "set aside, not deleted"
