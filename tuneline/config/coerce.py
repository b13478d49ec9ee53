"""Turn YAML/CLI values into the declared type of a key, or say exactly why not."""

from __future__ import annotations

import types
import typing
from typing import Any

_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
               list: "a list", dict: "a mapping"}


def _base_types(annotation: Any) -> tuple[tuple[type, ...], bool]:
    """(allowed concrete types, whether None is allowed) of an annotation like `int | None`."""
    if isinstance(annotation, str):
        annotation = {"bool": bool, "int": int, "float": float, "str": str, "list": list, "dict": dict,
                      "any": object}[annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        concrete = tuple(typing.get_origin(a) or a for a in args if a is not type(None))
        return concrete, type(None) in args
    return (origin or annotation,), False


def coerce(key: str, value: Any, annotation: Any, choices: tuple | None = None) -> tuple[Any, str | None]:
    """Return (value, None) or (None, problem) for `key: value` declared as `annotation`."""
    allowed, nullable = _base_types(annotation)
    textual_null = isinstance(value, str) and value.lower() in ("null", "none", "~")
    if value is None or (textual_null and str not in allowed and object not in allowed):
        return (None, None) if nullable or object in allowed else (None, f"'{key}' must not be empty")
    if object in allowed:
        return value, None
    for kind in allowed:
        converted = _convert(value, kind)
        if converted is not _FAIL:
            if choices and converted not in choices:
                options = ", ".join(str(c) for c in choices)
                return None, f"'{key}' is {value!r}; allowed values: {options}"
            return converted, None
    wanted = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in allowed)
    return None, f"'{key}' is {value!r} ({type(value).__name__}); expected {wanted}"


_FAIL = object()


def _convert(value: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
            return value.lower() in ("true", "yes")
        return _FAIL
    if kind is int:
        if isinstance(value, bool):
            return _FAIL
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                return _FAIL
        return _FAIL
    if kind is float:
        if isinstance(value, bool):
            return _FAIL
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):  # PyYAML reads 5e-5 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                return _FAIL
        return _FAIL
    if kind is str:
        return value if isinstance(value, str) else (str(value) if isinstance(value, (int, float)) else _FAIL)
    if kind is list:
        if isinstance(value, list):
            return value
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return _FAIL
    if kind is dict:
        return value if isinstance(value, dict) else _FAIL
    return value if isinstance(value, kind) else _FAIL
