"""The one error type a user can cause, and how it is shown: one message and exit code 2, never a traceback."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable


class UserError(Exception):
    """A problem the user can fix; carries every problem found, not just the first."""

    exit_code = 2

    def __init__(self, problems: str | Iterable[str], title: str = "tuneline cannot start"):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.title = title
        super().__init__(self.format())

    def format(self) -> str:
        if len(self.problems) == 1:
            return f"{self.title}: {self.problems[0]}"
        lines = "\n".join(f"  - {p}" for p in self.problems)
        return f"{self.title} ({len(self.problems)} problems):\n{lines}"


class ConfigError(UserError):
    """Bad keys, values or combinations in a run config."""

    def __init__(self, problems: str | Iterable[str], source: str | None = None):
        title = f"invalid config {source}" if source else "invalid config"
        super().__init__(problems, title=title)


class DataError(UserError):
    """Bad dataset rows, files or registry entries."""

    def __init__(self, problems: str | Iterable[str]):
        super().__init__(problems, title="invalid dataset")


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The most similar valid name, for 'did you mean' hints."""
    found = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    hint = closest(name, candidates)
    return f"; did you mean '{hint}'?" if hint else ""


class report_user_errors:
    """`with report_user_errors() as reported: return main()`, then `return reported.exit_code`: a UserError raised
    in the block becomes its message and code 2, Ctrl-C a hint and 130. A `with` block, not a wrapping call, so no
    frame of its own sits between a command and its work.
    """

    exit_code = 0

    def __enter__(self) -> report_user_errors:
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if isinstance(error, UserError):
            print(f"error: {error.format()}", file=sys.stderr)
            self.exit_code = error.exit_code
        elif isinstance(error, KeyboardInterrupt):
            print("interrupted: run the same command again to resume from the last checkpoint", file=sys.stderr)
            self.exit_code = 130
        return isinstance(error, (UserError, KeyboardInterrupt))
