"""Each step's typed result, stored by Prefect in one process and read back in another (a rerun), also when an
earlier tuneline stored it as a dict; a stored result without a field the record needs is refused by name."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL

from tests.support.stored_step_flow import FIELDS, run_stored_steps
from tuneline.content.records import BuiltDataset, ReferenceLogps
from tuneline.pipeline.records import TrainResult

REPO = Path(__file__).resolve().parents[2]


def _store_in_another_process(folder: Path, stored_as: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    subprocess.run([sys.executable, str(REPO / "tests" / "support" / "stored_step_flow.py"), str(folder), stored_as],
                   env=env, check=True, timeout=300)


@pytest.mark.parametrize("stored_as", ["record", "dict"])
def test_stored_step_results_read_back_as_their_records(prefect_api, tmp_path, stored_as):
    _store_in_another_process(tmp_path / "results", stored_as)
    assert len(list((tmp_path / "results").iterdir())) == len(FIELDS), "Prefect stored each step's result"

    again = run_stored_steps(str(tmp_path / "results"), "none")  # a run of any step would raise

    assert again == {cls.__name__: cls(**fields) for cls, fields in FIELDS.items()}
    assert again["TrainResult"].path == Path("/runs/a")


@pytest.mark.parametrize("cls", list(FIELDS), ids=lambda cls: cls.__name__)
def test_a_stored_result_without_a_required_field_is_refused_by_name(cls):
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    for name in required:
        with pytest.raises(TypeError, match=f"not a stored {cls.__name__}: no {name}"):
            cls.from_stored({k: v for k, v in FIELDS[cls].items() if k != name})
    with pytest.raises(TypeError, match=f"not a stored {cls.__name__}"):
        cls.from_stored(["not", "a", "result"])


@pytest.mark.parametrize("cls", list(FIELDS), ids=lambda cls: cls.__name__)
def test_each_record_is_its_fields_and_nothing_else(cls):
    record = cls(**FIELDS[cls])
    assert record.to_dict() == FIELDS[cls] and cls.from_stored(record.to_dict()) == record
    with pytest.raises(AttributeError):
        record.output_path  # noqa: B018 - a field that does not exist fails here, not in a user's run
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.fingerprint = "changed"


def test_the_child_trains_on_the_reference_copy_only_when_one_was_made():
    dataset = BuiltDataset(path="/data", fingerprint="d")
    assert ReferenceLogps("r", needed=True, path="/with-logps").training_data(dataset) == "/with-logps"
    assert ReferenceLogps("r", needed=False, reason="simpo uses none").training_data(dataset) == "/data"
    assert TrainResult.from_stored({"output_dir": "/runs/a", "train_key": "t"}).metrics == {}
