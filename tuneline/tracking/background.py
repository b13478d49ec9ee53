"""Metrics sent from a worker thread, so the training loop never waits on MLflow.

One FIFO queue and one worker keep the step order. The training flushes at every checkpoint, so a value lost to a
kill never reaches behind the last checkpoint. An error a retry cannot fix is raised by the next call in the
training thread, as a synchronous logger would have raised it."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from tuneline.tracking.step_logger import StepMetricLogger

MAX_BATCH_STEPS = 200
SEND_INTERVAL_S = 5.0
_FLUSH, _STOP = object(), object()


class BackgroundStepLogger:
    """Wraps a StepMetricLogger: `log` only enqueues. The worker also builds it, so the first steps train while MLflow
    is imported."""

    def __init__(self, make_logger: Callable[[], StepMetricLogger], interval_s: float = SEND_INTERVAL_S):
        self.make_logger = make_logger
        self.logger: StepMetricLogger | None = None
        self.interval_s = interval_s
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="tuneline-mlflow-metrics", daemon=True)
        self._thread.start()

    def _next_batch(self) -> list:
        """What is logged within interval_s of the first value (or until a flush or stop), in order."""
        batch = [self._queue.get()]
        deadline = time.monotonic() + self.interval_s
        while len(batch) < MAX_BATCH_STEPS and batch[-1] is not _FLUSH and batch[-1] is not _STOP:
            try:
                batch.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return batch

    def _work(self) -> None:
        try:
            self.logger = self.make_logger()
        except BaseException as err:  # the caller sees it at its next log(), flush() or close()
            self._error = err
        stop = False
        while not stop:
            batch = self._next_batch()
            stop = batch[-1] is _STOP
            items = [item for item in batch if item is not _FLUSH and item is not _STOP]
            try:
                if items and self._error is None and self.logger:  # after a hard error nothing more is sent
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

    def log(self, metrics: dict[str, float], step: int, timestamp_ms: int | None = None) -> None:
        self._raise_error()
        if self._closed:
            raise RuntimeError("log() after close()")
        self._queue.put((dict(metrics), step, timestamp_ms or int(time.time() * 1000)))  # when logged, not sent

    def flush(self) -> None:
        """Send what is queued now, and wait until it was sent or spooled."""
        if not self._closed:
            self._queue.put(_FLUSH)
        self._queue.join()
        self._raise_error()

    def close(self) -> int:
        """Drain the queue, stop the worker, then close the wrapped logger: values still spooled (0 = all sent)."""
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)
            self._thread.join()
        self._raise_error()
        return self.logger.close() if self.logger else 0
