"""Tiny vision-language processors built offline by benchmarks/mm_parity.py's `build_processor`, shared by the
multimodal tests: the same folders the parity snapshot was made with."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEMO_IMAGES = REPO / "tests" / "fixtures" / "llamafactory" / "0.9.5" / "data" / "mllm_demo_data"


def load_parity_benchmark(name: str = "mm_parity"):
    """benchmarks/NAME.py as a module: its processor builders and its LLaMA-Factory snapshot's reader."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
