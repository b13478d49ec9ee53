"""Where the MLflow store is, whether it can be reached, and a client bound to it.

Nothing here reads or sets MLflow's process-global (fluent) state, so a flow, its tasks and the training subprocess
can talk to the same run; `mlflow` is imported only inside functions, so a cached step never loads it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from tuneline.errors import UserError

if TYPE_CHECKING:
    from mlflow import MlflowClient

DEFAULT_URI = "sqlite:///mlflow.db"
SERVER_HINT = "mlflow server --host 127.0.0.1 --port 5000 -w 1"
API_PROBE = "/api/2.0/mlflow/experiments/search?max_results=1"

# run id -> tracking URI, filled by open_run so calls that only name a run reach the store it lives in.
_RUN_URIS: dict[str, str] = {}


def resolve_tracking_uri(uri: str | None) -> str:
    """Config value, else $MLFLOW_TRACKING_URI, else ./mlflow.db; SQLite paths made absolute because the training
    subprocess may run in another folder and must write the same store."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///") :]
        if path and path != ":memory:" and not path.startswith("/"):
            return "sqlite:///" + str(Path(path).resolve())
    return uri


LOCAL_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default
# MLflow 3's UI shows an experiment in its GenAI or its model-training view by a switch kept per browser (GenAI
# unless changed), whatever the experiment's `mlflow.experimentKind` tag says; this query opens model training.
MODEL_TRAINING_VIEW = "?workflowType=machine_learning"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI, else None."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def is_http(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def check_tracking_available(uri: str, timeout_s: float = 5) -> None:
    """Fail before any work starts if the store cannot be reached or written."""
    if is_http(uri):
        _check_server(uri, timeout_s)
        return
    db = sqlite_path(uri)
    if db is not None:
        _check_writable_folder(db.parent, f"MLflow SQLite store {uri}")


def _check_server(uri: str, timeout_s: float) -> None:
    """GET /health; a 404 there gets a second chance on the REST API (a gateway may not route /health)."""
    reason = _probe(uri.rstrip("/") + "/health", timeout_s)
    if reason == "HTTP 404":
        reason = _probe(uri.rstrip("/") + API_PROBE, timeout_s)
        if reason == "HTTP 404":
            reason = "it answered HTTP 404 on /health and on the tracking API: no MLflow server at this address"
    if reason is None:
        return
    raise UserError(
        f"MLflow tracking server {uri} is not reachable ({reason}). Start one with `{SERVER_HINT}` "
        "(and set mlflow_tracking_uri / MLFLOW_TRACKING_URI to its address), or use a local store such as "
        "sqlite:///mlflow.db.",
        title="MLflow is not available",
    )


def _probe(url: str, timeout_s: float) -> str | None:
    """None when an HTTP server answered below 500 (auth may reject the probe itself), else why not."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return None
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return "HTTP 404"
        if err.code < 500:
            return None
        return f"it answered HTTP {err.code} on {url}"
    except OSError as err:  # URLError, refused, timeout
        return f"{getattr(err, 'reason', err)}"


def is_transient(err: BaseException) -> bool:
    """Connection refused/reset, timeouts, 5xx and a locked SQLite file: worth retrying later."""
    import requests

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, (requests.RequestException, ConnectionError, TimeoutError)):
            return True
        text = str(err)
        if "API request to" in text and "failed with" in text or "database is locked" in text:
            return True
        code = getattr(err, "get_http_status_code", None)
        if callable(code) and code() >= 500:
            return True
        err = err.__cause__ or err.__context__
    return False


def _check_writable_folder(folder: Path, what: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(
            f"cannot create the folder {folder} for the {what}: {err}. Pick a writable path.",
            title="MLflow is not available",
        ) from err
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(
            f"the folder {folder} for the {what} is not writable. Pick a writable path.",
            title="MLflow is not available",
        )


def default_artifact_location(uri: str, experiment: str) -> str | None:
    """Artifacts of a SQLite store live in `mlartifacts/<experiment>` beside the db file; a server chooses its own."""
    db = sqlite_path(uri)
    if db is None:
        return None
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in experiment).strip(".") or "default"
    return (db.parent / "mlartifacts" / safe).resolve().as_uri()


def remember_run(run_id: str, uri: str) -> None:
    _RUN_URIS[run_id] = uri


def uri_for(run_id: str, tracking_uri: str | None = None) -> str:
    """Explicit URI, else the one the run was opened with in this process, else config-less resolution."""
    if tracking_uri:
        return resolve_tracking_uri(tracking_uri)
    return _RUN_URIS.get(run_id) or resolve_tracking_uri(None)


def client_for(uri: str) -> MlflowClient:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def open_stores(uri: str) -> None:
    """Connect the tracking and registry stores (MLflow caches them per URI for the rest of the process). A SQLite
    store that does not exist yet is made whole first (`create_sqlite_store`); one left half-made by an older
    start is named with the way out, never changed."""
    db = sqlite_path(uri)
    if db is not None and not db.exists():
        create_sqlite_store(db)
    try:
        _connect(uri)
    except Exception as err:
        if db is not None and (why := half_made_store(db, err)):
            raise UserError(half_made_message(db, why), title="MLflow is not available") from None
        raise


def _connect(uri: str) -> None:
    client = client_for(uri)
    client.search_experiments(max_results=1)
    client.search_registered_models(max_results=1)


CREATING = ".creating-"  # `.<store name>.creating-<pid>`: a store being built beside the one it becomes


def create_sqlite_store(db: Path) -> None:
    """MLflow builds a new store's schema in many steps (a migration per version) that a kill can cut short,
    leaving a file every later start fails on. So it is built under a temporary name beside `db` and linked into
    place whole; a store another process made meanwhile is kept, never replaced."""
    db.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_builds(db)
    building = db.with_name(f".{db.name}{CREATING}{os.getpid()}")
    building.unlink(missing_ok=True)
    try:
        _connect(f"sqlite:///{building}")
        try:
            os.link(building, db)  # fails if `db` exists: unlike a rename, it never replaces a store
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links
            if not db.exists():
                os.replace(building, db)
    finally:
        for path in (building, building.with_name(building.name + "-journal")):
            path.unlink(missing_ok=True)


def _remove_abandoned_builds(db: Path) -> None:
    """Builds left by killed starts (their process is gone) are deleted: they were never a store anyone used."""
    for path in db.parent.glob(f".{db.name}{CREATING}*"):  # the build and its SQLite journal
        pid = path.name[len(f".{db.name}{CREATING}"):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# How MLflow fails on a store whose schema migration was cut short: it migrates again over what is already there.
MIGRATION_REDONE = ("already exists", "duplicate column name", "out-of-date database schema")


def half_made_store(db: Path, error: BaseException) -> str | None:
    """Why a SQLite store that fails to open (with `error`) looks half-made (its schema's creation was cut short),
    else None."""
    import sqlite3

    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            version = conn.execute("SELECT version_num FROM alembic_version").fetchall() if (
                "alembic_version" in tables) else []
    except sqlite3.Error as err:
        return f"it does not read as SQLite: {err}"
    leftovers = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    if leftovers:
        return f"a schema migration was cut short (it holds {leftovers[0]})"
    if not version:
        return "its schema was never finished (no schema version recorded)"
    said = str(error)
    if any(sign in said for sign in MIGRATION_REDONE):
        return f"a schema migration was cut short (opening it fails with: {said.splitlines()[0][:160]})"
    return None


def half_made_message(db: Path, why: str) -> str:
    return (f"the MLflow store {db} was left half-made by a start stopped while creating it: {why}. Move it away "
            f"(`mv {db} {db}.broken`) and run the same command again: a new store is created. If it held runs you "
            "need, open it with the MLflow version that made it and export them first.")


def run_url(uri: str, run_id: str) -> str | None:
    """The run's page in the MLflow UI: on the tracking server, or for a local store where `ui_command` serves it."""
    uri = resolve_tracking_uri(uri)
    if is_http(uri):
        ui = uri.rstrip("/")
    elif ui_command(uri):
        ui = LOCAL_UI
    else:
        return None
    try:
        experiment_id = client_for(uri).get_run(run_id).info.experiment_id
    except Exception:  # a link is a nicety: never fail a step for it
        experiment_id = None
    if not experiment_id:
        return f"{ui}/"
    return f"{ui}/#/experiments/{experiment_id}/runs/{run_id}{MODEL_TRAINING_VIEW}"


def ui_command(uri: str) -> str | None:
    """For a store without a server (SQLite), the command that serves its UI at LOCAL_UI; None for a server."""
    uri = resolve_tracking_uri(uri)
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1" if sqlite_path(uri) is not None else None
