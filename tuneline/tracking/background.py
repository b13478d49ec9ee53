"""Metrics sent from a worker thread, so the training loop never waits on MLflow.

A logged step costs MLflow's SQLite commit (an fsync, ~30 ms here) or an HTTP round trip (~70 ms with a local
server on 2 busy cores); with a small model and `logging_steps: 1` that would add tens of percent to training.
Both mostly wait on I/O, so a thread overlaps them with the next steps. One FIFO queue and one worker keep the
step order; what queued up while a request was out goes in the next request, so a slow server never lets the
queue grow long. Each value keeps the time it was logged. `close()` waits until everything queued was sent (or
spooled). A value still queued when the process is killed is missing from MLflow (trainer_log.jsonl keeps it);
that window is about one request. An error a retry cannot fix (not an outage) is raised by the next `log()`,
`flush()` or `close()` in the training thread, as the synchronous logger would have raised it.
"""

from __future__ import annotations

import queue
import threading
import time

from tuneline.tracking.step_logger import StepMetricLogger

MAX_BATCH_STEPS = 200


class BackgroundStepLogger:
    """Wraps a StepMetricLogger: `log` only enqueues; the worker calls the wrapped logger in order."""

    def __init__(self, logger: StepMetricLogger):
        self.logger = logger
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="tuneline-mlflow-metrics", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        stop = False
        while not stop:
            batch = [self._queue.get()]
            while len(batch) < MAX_BATCH_STEPS:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch
            items = [item for item in batch if item is not None]
            try:
                if items and self._error is None:  # after a hard error nothing more is sent; the caller sees it
                    self.logger.log_steps(items)
            except BaseException as err:
                self._error = err
            finally:
                for _ in batch:
                    self._queue.task_done()

    def _raise_error(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._raise_error()
        if self._closed:
            raise RuntimeError("log() after close()")
        self._queue.put((dict(metrics), step, int(time.time() * 1000)))  # the time it was logged, not sent

    def flush(self) -> None:
        """Wait until every queued value was sent or spooled."""
        self._queue.join()
        self._raise_error()

    def close(self) -> int:
        """Drain the queue, stop the worker, then close the wrapped logger: values still spooled (0 = all sent)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join()
        self._raise_error()
        return self.logger.close()
