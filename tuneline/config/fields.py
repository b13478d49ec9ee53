"""`arg`: a dataclass field with its help text (and allowed values), as every config key is declared."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def arg(default: Any = None, help: str = "", choices: tuple | None = None) -> Any:
    meta = {"help": help}
    if choices:
        meta["choices"] = choices
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)
