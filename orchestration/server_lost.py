"""A Prefect server that stops answering mid-run ends the command with one line, not tracebacks and a long wait.

The training and every step's result do not need the server (task results are stored in `pipeline_cache_dir`, the
record is in MLflow): the flow runs to its end and stops at its first call that does (the run's artifacts, its
final state). Then, instead of Prefect's tracebacks of `ConnectError`, the command prints what happened and what to
do, and exits at once: left to itself, the process would spend minutes at exit trying to send its queued events to
the server that is gone. While the server is away, Prefect's event sender logs each event it cannot send (a
screenful every few seconds); those records are folded into one line.
"""

from __future__ import annotations

import logging
import os
import sys

import httpx

from orchestration.user_errors import filter_once

LOST_EVENTS = ("Service %r failed to process item", "EventsWorker")  # the record's format and first argument
NO_CONNECTION = "Unable to connect to"
QUIET_LOGGERS = ("prefect._internal.concurrency", "prefect.events.clients", "prefect.flow_runs", "prefect.task_runs")


def api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    return str(PREFECT_API_URL.value() or "")


def is_server_lost(error: BaseException | None) -> bool:
    """Whether `error` is the Prefect API not answering (a transport error on a request to PREFECT_API_URL)."""
    if not isinstance(error, httpx.TransportError):
        return False
    try:
        url = str(error.request.url)
    except RuntimeError:  # an error raised without its request
        return True
    base = api_url()
    return not base or url.startswith(base.rstrip("/"))


def server_lost_message() -> str:
    return (f"the Prefect server ({api_url() or 'PREFECT_API_URL'}) stopped answering during the run; the steps that "
            "finished, training included, are stored: start the server again and run the same command, and they "
            "are found cached")


class QuietWhileServerLost(logging.Filter):
    """Folds Prefect's records about a server that does not answer into one line each, once."""

    def __init__(self):
        super().__init__()
        self.said: set[str] = set()

    def _once(self, record: logging.LogRecord, kind: str, text: str) -> bool:
        if kind in self.said:
            return False
        self.said.add(kind)
        record.msg, record.args, record.exc_info, record.exc_text = text, (), None, None
        return True

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith(LOST_EVENTS[0]) and record.args and record.args[0] == LOST_EVENTS[1]:
            return self._once(record, "events", "the Prefect server does not answer: the run's events are not sent "
                                                "to it (training goes on)")
        if message.startswith(NO_CONNECTION):
            return self._once(record, "connect", f"cannot connect to the Prefect server at {api_url()}")
        if record.exc_info and is_server_lost(record.exc_info[1]):
            return self._once(record, "lost", f"error: {server_lost_message()}")
        return True


def quiet_while_server_lost() -> None:
    filter_once(QUIET_LOGGERS, QuietWhileServerLost)


def exit_now(code: int) -> None:
    """End the process without Prefect's exit-time drain of events to a server that is gone (which waits on each
    of them); output is flushed first, and nothing else is left to write: MLflow has the run, the caches the
    results."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
