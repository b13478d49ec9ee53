"""The train step's typed result, stored by Prefect in one process and read back in another (a rerun), also when
an earlier tuneline stored it as a dict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL

from tests.support.stored_train_flow import FIELDS, run_stored_train
from tuneline.pipeline.records import TrainResult

REPO = Path(__file__).resolve().parents[2]


def _store_in_another_process(folder: Path, stored_as: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests" / "flows")]),
           "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    subprocess.run([sys.executable, str(Path(__file__).parents[1] / "support" / "stored_train_flow.py"), str(folder), stored_as],
                   env=env, check=True, timeout=300)


@pytest.mark.parametrize("stored_as", ["record", "dict"])
def test_a_stored_train_result_reads_back_as_the_record(prefect_api, tmp_path, stored_as):
    _store_in_another_process(tmp_path / "results", stored_as)
    assert any((tmp_path / "results").iterdir()), "Prefect stored the step's result"

    again = run_stored_train(str(tmp_path / "results"), "none")  # a run of the step would raise

    assert again == TrainResult(**FIELDS) and again.path == Path("/runs/a")


def test_a_stored_result_without_its_key_is_refused_by_name():
    with pytest.raises(TypeError, match="not a train step result"):
        TrainResult.from_stored({"output_dir": "/runs/a"})


def test_the_record_is_its_fields_and_nothing_else():
    result = TrainResult(**FIELDS)
    assert result.to_dict() == FIELDS
    with pytest.raises(AttributeError):
        result.output_path  # noqa: B018 - a field that does not exist fails here, not in a user's run
    with pytest.raises(TypeError):
        TrainResult(output_dir="/runs/a")  # train_key is required
