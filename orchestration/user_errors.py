"""A mistake the user can fix ends a run with its message, not with a traceback.

Prefect logs the exception that fails a task or a flow with its traceback. For a UserError (a config key, a data
row, a path) the message already names the key, file or row and what to do, and the traceback only buries it:
this filter drops the traceback from such records. Every other exception keeps its traceback.
"""

from __future__ import annotations

import logging

from tuneline.errors import UserError

RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


class UserErrorsWithoutTraceback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, UserError):
            record.msg, record.args = f"error: {error.format()}", ()
            record.exc_info, record.exc_text = None, None
        return True


def filter_once(logger_names: tuple[str, ...], kind: type[logging.Filter]) -> None:
    """Put a `kind` filter on each named logger that has none yet (importing a flow twice adds nothing)."""
    for name in logger_names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())


def show_user_errors_without_traceback() -> None:
    filter_once(RUN_LOGGERS, UserErrorsWithoutTraceback)
