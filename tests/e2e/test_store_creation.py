"""The embedded MLflow store: a start killed while creating it leaves nothing that stops the next one, and a store
left half-made (by an older tuneline, or by MLflow itself) is named with the way out, never changed.

The kill is real: a `python` process opening a new SQLite store through `open_stores` is SIGKILLed while MLflow
migrates its schema (benchmarks/chaos.py's test-only hook pauses it the instant a migration made its work table)."""

from __future__ import annotations

import importlib.util
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuneline.errors import UserError
from tuneline.tracking.store import client_for, open_stores

REPO = Path(__file__).resolve().parents[2]
OPEN = "import sys; from tuneline.tracking.store import open_stores; open_stores(sys.argv[1])"


def chaos_module():
    spec = importlib.util.spec_from_file_location("chaos", REPO / "benchmarks" / "chaos.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_a_start_killed_while_migrating_a_new_store_leaves_the_next_start_a_whole_store(tmp_path):
    chaos = chaos_module()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, **chaos.pause_store_migration_env(tmp_path)}
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(REPO)])
    proc = subprocess.Popen([sys.executable, "-c", OPEN, uri], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while not chaos.migrating_store(tmp_path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    reached = chaos.migrating_store(tmp_path)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert reached, "the store's creation never reached a migration"

    open_stores(uri)  # the next start: the same call the flow makes
    client = client_for(uri)
    run = client.create_run(client.create_experiment("after-the-kill"))
    client.log_metric(run.info.run_id, "loss", 1.0)
    assert client.get_metric_history(run.info.run_id, "loss")[0].value == 1.0
    assert not [p.name for p in tmp_path.iterdir() if ".creating-" in p.name]  # no build left beside it


def test_an_existing_store_is_opened_as_it_is(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    open_stores(uri)
    client_for(uri).create_experiment("kept")
    before = (tmp_path / "mlflow.db").stat().st_ino
    open_stores(uri)
    assert (tmp_path / "mlflow.db").stat().st_ino == before
    assert client_for(uri).get_experiment_by_name("kept") is not None


def test_a_half_made_store_is_named_with_the_way_out_and_left_alone(tmp_path):
    db = tmp_path / "mlflow.db"
    subprocess.run([sys.executable, "-c", OPEN, f"sqlite:///{db}"], check=True, capture_output=True)
    with sqlite3.connect(db) as conn:  # what a migration cut short leaves: its work table, no schema version
        conn.execute("CREATE TABLE _alembic_tmp_experiments (experiment_id INTEGER)")
        conn.execute("DELETE FROM alembic_version")
    content = db.read_bytes()

    with pytest.raises(UserError) as raised:
        open_stores(f"sqlite:///{db}")
    message = str(raised.value)
    assert str(db) in message and "_alembic_tmp_experiments" in message and f"mv {db} {db}.broken" in message
    assert db.read_bytes() == content
