"""Per-step metrics from the training subprocess: each step once, and nothing lost while MLflow is down.

After a resume the trainer may log steps MLflow already holds, so anything at or below MLflow's last step per key
is dropped. A connection failure must not stop training: values then go in order to a spool file, sent later in
step order. MLflow's own HTTP retries are cut for these calls, so a down server costs a step seconds, not minutes."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tuneline.tracking.runs import send_metrics
from tuneline.tracking.store import client_for, is_transient, resolve_tracking_uri

log = logging.getLogger(__name__)

SPOOL_NAME = "mlflow_spool.jsonl"


# MLflow reads its HTTP settings from the process-wide environment. A metrics worker thread changes them for
# its sends; holding this lock meanwhile keeps another thread's MLflow calls (a checkpoint upload) from running
# with those short settings, and keeps two changes from interleaving.
_HTTP_ENV_LOCK = threading.RLock()


@contextmanager
def short_http_retries(retries: int = 0, timeout_s: int = 5) -> Iterator[None]:
    """MLflow reads these per request; the defaults (7 retries, 120 s timeout) would stall a step for minutes."""
    wanted = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(retries), "MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout_s)}
    with _HTTP_ENV_LOCK:
        saved = {k: os.environ.get(k) for k in wanted}
        os.environ.update(wanted)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@contextmanager
def default_http_retries() -> Iterator[None]:
    """For MLflow calls that need MLflow's own retries (large uploads): waits for a metrics send in flight."""
    with _HTTP_ENV_LOCK:
        yield


def last_logged_steps(client, run_id: str, keys=None) -> dict[str, int]:
    """Highest step MLflow holds for each metric key of the run (all keys when `keys` is None)."""
    if keys is None:
        keys = client.get_run(run_id).data.metrics.keys()
    last = {}
    for key in keys:
        history = client.get_metric_history(run_id, key)
        if history:
            last[key] = max(m.step for m in history)
    return last


def _read_spool(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a crash mid-write: the rest is still good
            log.warning("skipping a damaged line in %s", path)
    return entries


def _write_spool(path: Path, entries: list[dict]) -> None:
    if not entries:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
    os.replace(tmp, path)


def _send_spool(client, run_id: str, path: Path, batch: int = 500) -> int:
    """Send this run's spooled values not yet in MLflow, in step order; raises on failure (spool kept)."""
    entries = _read_spool(path)
    others = [e for e in entries if e["run_id"] != run_id]
    latest = {(e["key"], e["step"]): e for e in entries if e["run_id"] == run_id}  # a step spooled twice: last
    if not latest:
        return 0
    last = last_logged_steps(client, run_id, {key for key, _ in latest})
    pending = sorted((e for (key, step), e in latest.items() if step > last.get(key, -1)), key=lambda e: e["step"])
    while pending:
        chunk, pending = pending[:batch], pending[batch:]
        send_metrics(client, run_id, [(e["key"], e["value"], e["step"], e["ts"]) for e in chunk])
        _write_spool(path, others + pending)
    _write_spool(path, others)
    return 0


def spooled_count(run_id: str, spool_dir: str | Path) -> int:
    """How many values of `run_id` wait in the spool."""
    return sum(1 for e in _read_spool(Path(spool_dir) / SPOOL_NAME) if e["run_id"] == run_id)


def flush_spool(
    run_id: str, tracking_uri: str | None, spool_dir: str | Path, *, http_retries: int = 0, http_timeout_s: int = 5
) -> int:
    """Send what a logger spooled for `run_id` while MLflow was unreachable; returns how many values still wait (0:
    all sent). An unreachable server leaves the spool for a later call."""
    path = Path(spool_dir) / SPOOL_NAME
    if not path.is_file():
        return 0
    client = client_for(resolve_tracking_uri(tracking_uri))
    with short_http_retries(http_retries, http_timeout_s):
        try:
            return _send_spool(client, run_id, path)
        except Exception as err:
            if not is_transient(err):
                raise
            left = spooled_count(run_id, spool_dir)
            log.warning("MLflow still unreachable (%s); %d values stay in %s", err, left, path)
            return left


class StepMetricLogger:
    """Log training metrics with the trainer's global step as the MLflow step; survives server outages."""

    def __init__(
        self,
        run_id: str,
        tracking_uri: str | None,
        spool_dir: str | Path,
        *,
        retry_interval_s: float = 5.0,
        http_retries: int = 0,
        http_timeout_s: int = 5,
    ):
        self.run_id = run_id
        self.uri = resolve_tracking_uri(tracking_uri)
        self.spool_dir = Path(spool_dir)
        self.retry_interval_s = retry_interval_s
        self._http = (http_retries, http_timeout_s)
        self._client = client_for(self.uri)
        self._last: dict[str, int] = {}  # highest step logged or spooled per key
        self._loaded = False  # whether MLflow's own last steps are merged into _last
        self._spooling = spooled_count(run_id, spool_dir) > 0  # a crashed process may have left values
        self._next_try = 0.0
        self._load_last_steps()
        if self._spooling and self._loaded:
            self._flush(force=True)

    def _load_last_steps(self) -> None:
        try:
            with short_http_retries(*self._http):
                server = last_logged_steps(self._client, self.run_id)
        except Exception as err:
            if not is_transient(err):
                raise
            log.warning("MLflow unreachable (%s); metrics go to %s until it returns", err, self.spool_dir)
            self._next_try = time.monotonic() + self.retry_interval_s
            self._spooling = True
            return
        for key, step in server.items():
            self._last[key] = max(step, self._last.get(key, -1))
        self._loaded = True

    def log(self, metrics: dict[str, float], step: int, timestamp_ms: int | None = None) -> None:
        """Log the values not yet logged at this step; never raises for an unreachable server."""
        self.log_steps([(metrics, step, timestamp_ms)])

    def log_steps(self, items: list[tuple[dict[str, float], int, int | None]]) -> None:
        """Several steps' (metrics, step, timestamp_ms or None for now) in one request, in order."""
        now = int(time.time() * 1000)
        fresh = []
        for metrics, step, ts in items:
            values = {k: float(v) for k, v in metrics.items() if v is not None and step > self._last.get(k, -1)}
            if values:
                self._last.update(dict.fromkeys(values, step))
                fresh.append((values, step, ts or now))
        if not fresh:
            return
        if self._spooling:
            self._append(fresh)
            self._flush()
            return
        try:
            with short_http_retries(*self._http):
                send_metrics(self._client, self.run_id, [(k, v, step, ts) for values, step, ts in fresh
                                                         for k, v in values.items()])
        except Exception as err:
            if not is_transient(err):
                raise
            log.warning("MLflow unreachable (%s); spooling metrics to %s", err, self.spool_dir / SPOOL_NAME)
            self._append(fresh)
            self._spooling = True
            self._next_try = time.monotonic() + self.retry_interval_s

    def _append(self, fresh: list[tuple[dict[str, float], int, int]]) -> None:
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            json.dumps({"run_id": self.run_id, "key": k, "value": v, "step": step, "ts": ts}) + "\n"
            for values, step, ts in fresh
            for k, v in values.items()
        ]
        with (self.spool_dir / SPOOL_NAME).open("a", encoding="utf-8") as f:
            f.write("".join(lines))

    def _flush(self, force: bool = False) -> int:
        """Send the spool if the retry interval has passed (or `force`); returns values still waiting."""
        if not force and time.monotonic() < self._next_try:
            return -1
        if not self._loaded:
            self._load_last_steps()
        if self._loaded:
            left = flush_spool(
                self.run_id, self.uri, self.spool_dir, http_retries=self._http[0], http_timeout_s=self._http[1]
            )
        else:
            left = spooled_count(self.run_id, self.spool_dir)
        self._spooling = left > 0
        if left:
            self._next_try = time.monotonic() + self.retry_interval_s
        return left

    def close(self) -> int:
        """Try once more to send the spool; returns how many values still wait there (0 = all in MLflow)."""
        if not self._spooling:
            return 0
        return self._flush(force=True)
