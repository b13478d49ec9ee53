"""The training child's output to Prefect: each line on the console as it comes, gathered for Prefect's API.

A record costs the command ~1 ms of CPU on its way to the API (the run context, the log schema, a wakeup of
Prefect's log worker), where the console costs ~0.5 ms; and each batch Prefect's log worker posts (every 2 s while
records come) costs the server ~8 ms. Training on a CPU pays about twice for CPU taken beside it, and the child
prints a line per logging step (several a second on a small model). So the API gets one record with the lines
of each `API_INTERVAL_S` (5 s, as often as the MLflow metrics are sent); the console gets each line at once. Measured in a 1000-step demo run: command 0.75% -> 0.45% of a core while the loop runs,
server 0.8% -> 0.6%.
"""

from __future__ import annotations

import contextvars
import logging
import threading

from prefect.logging.handlers import APILogHandler

API_INTERVAL_S = 5.0


class ChildLog:
    """`line(text)` for each line; use as a context manager, so that the last lines are sent on exit."""

    def __init__(self, run_logger: logging.LoggerAdapter, interval_s: float = API_INTERVAL_S):
        self._console = run_logger
        self._api = logging.Logger("training", level=logging.getLogger("prefect.task_runs").getEffectiveLevel())
        self._api.addHandler(APILogHandler())
        self._run_ids = dict(run_logger.extra or {})  # flow_run_id, task_run_id, names: the record's run
        self._interval_s = interval_s
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # the run's settings (its API URL) and context live in context variables, which a thread does not inherit
        self._sender = threading.Thread(target=contextvars.copy_context().run, args=(self._send_every_interval,),
                                        name="tuneline-child-log", daemon=True)

    def __enter__(self) -> ChildLog:
        self._sender.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sender.join()
        self._send()

    def line(self, text: str) -> None:
        self._console.info(text, extra={"send_to_api": False})
        with self._lock:
            self._lines.append(text)

    def _send_every_interval(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._send()

    def _send(self) -> None:
        with self._lock:
            lines, self._lines = self._lines, []
        if lines:
            self._api.info("\n".join(lines), extra=self._run_ids)
