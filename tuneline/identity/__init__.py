"""What makes two pieces of work the same: here, the version of the code each step runs (tuneline.identity.code)."""

from tuneline.identity.code import STEP_ENTRIES, imported_modules, step_code_version

__all__ = ["STEP_ENTRIES", "imported_modules", "step_code_version"]
