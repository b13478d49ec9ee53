"""A Prefect server lost mid-run (orchestration/server_lost.py): which errors mean it, and Prefect's records about it folded
into one line each. The whole case, with a real server killed mid-train, is `make chaos --cases "prefect server
lost"` (benchmarks/chaos.py)."""

from __future__ import annotations

import logging

import httpx
import pytest

from orchestration.server_lost import QuietWhileServerLost, is_server_lost

API = "http://127.0.0.1:4321/api"


@pytest.fixture(autouse=True)
def api_url(monkeypatch):
    """PREFECT_API_URL as this test's: a test process may hold another (its test harness's) in Prefect's settings."""
    monkeypatch.setattr("orchestration.server_lost.api_url", lambda: API)


def _refused(url: str) -> httpx.ConnectError:
    return httpx.ConnectError("[Errno 111] Connection refused", request=httpx.Request("POST", url))


def test_a_transport_error_to_the_prefect_api_is_the_server_lost():
    assert is_server_lost(_refused(f"{API}/artifacts/"))
    assert not is_server_lost(_refused("http://127.0.0.1:5000/api/2.0/mlflow/runs/get"))  # MLflow's own
    assert not is_server_lost(ValueError("no"))


def _record(name: str, msg: str, args=(), exc=None) -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, (type(exc), exc, None) if exc else None)


def test_prefects_records_about_the_lost_server_fold_into_one_line_each():
    quiet = QuietWhileServerLost()
    events = [_record("prefect._internal.concurrency", "Service %r failed to process item %r", ("EventsWorker", i))
              for i in range(3)]
    assert [quiet.filter(r) for r in events] == [True, False, False]
    assert "Event" not in events[0].getMessage() and "training goes on" in events[0].getMessage()
    crashed = _record("prefect.flow_runs", "Encountered exception during execution", exc=_refused(f"{API}/x"))
    assert quiet.filter(crashed) and crashed.exc_info is None
    assert crashed.getMessage().startswith("error: the Prefect server (http://127.0.0.1:4321/api) stopped answering")
    other = _record("prefect._internal.concurrency", "Service %r failed to process item %r", ("APILogWorker", 1))
    assert quiet.filter(other) and other.args == ("APILogWorker", 1)  # other services' records are left as they are
