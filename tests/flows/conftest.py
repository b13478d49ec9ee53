"""A real Prefect API for flow tests, started once per session, with home and results isolated.

prefect_test_harness does not isolate result storage (../shared/STACK.md): without separate folders, cache
hits would leak between tests and from a developer's own runs.
"""

import os
import tempfile
from pathlib import Path

import pytest

_HOME = Path(tempfile.mkdtemp(prefix="tuneline-prefect-home-"))
os.environ["PREFECT_HOME"] = str(_HOME)
os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"] = str(_HOME / "results")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_LOGGING_LEVEL"] = "INFO"  # as users run: the training's lines reach the API


@pytest.fixture(scope="session")
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
