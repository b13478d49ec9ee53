"""Fixtures of the end-to-end tier."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def chaos():
    """benchmarks/chaos.py as a module: the fault suite's runs, kills and checks, shared with `make chaos`."""
    spec = importlib.util.spec_from_file_location("chaos", REPO / "benchmarks" / "chaos.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module
