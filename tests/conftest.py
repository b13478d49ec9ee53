"""What every test shares: the tier markers (from the folder a test lives in), the run's one Prefect API and tiny
models (built once per run, whatever the number of test processes), the bundled demo data, and the record of what
each test costs (tests/durations.json).

The tiers: unit (no subprocess, no server, no training; the whole tier within UNIT_BUDGET_S, checked at the end of
a run of it), integration (training in process on the tiny models, `accelerate launch`), e2e (flows, servers,
chaos, the browser), acceptance (LLaMA-Factory's example configs, `make acceptance`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.support import durations, prefect_server

REPO_ROOT = Path(__file__).resolve().parents[1]
TIERS = ("unit", "integration", "e2e", "acceptance")
UNIT_BUDGET_S = 120  # `make test-fast`: feedback within two minutes on a 2-core machine

# Parallel test workers (pytest-xdist) share the cores: each gets its share of threads, passed on to the trainings
# it starts. torch's OpenMP threads wait for each other at every operation, so more threads than free cores stall
# every one of them; set before torch is imported.
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))

# Each test process is a Prefect client with its own home and result storage: prefect_test_harness-style isolation
# (../shared/STACK.md), so cache hits never leak from a developer's own runs or between test processes.
_HOME = Path(tempfile.mkdtemp(prefix="tuneline-prefect-home-"))
os.environ["PREFECT_HOME"] = str(_HOME)
os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"] = str(_HOME / "results")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_LOGGING_LEVEL"] = "INFO"  # as users run: the training's lines reach the API

# Fixtures of tests.support modules that tests in several folders use
pytest_plugins = ["tests.support.chat", "tests.support.llamafactory_examples"]

RUN_DIR, CONTROLLER_PID = "TUNELINE_TEST_RUN_DIR", "TUNELINE_TEST_CONTROLLER_PID"


def _is_controller(config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_configure(config):
    """The controller (the `pytest` process) makes the run's shared folder; its workers inherit its environment."""
    if _is_controller(config):
        os.environ[RUN_DIR] = tempfile.mkdtemp(prefix="tuneline-test-run-")
        os.environ[CONTROLLER_PID] = str(os.getpid())
        config.stash[durations.KEY] = durations.Recorder(time.monotonic())


def pytest_unconfigure(config):
    if _is_controller(config) and os.environ.get(RUN_DIR):
        prefect_server.stop(Path(os.environ[RUN_DIR]))
        shutil.rmtree(os.environ.pop(RUN_DIR), ignore_errors=True)


def tier_of(path: Path) -> str | None:
    parts = path.resolve().relative_to(REPO_ROOT / "tests").parts
    return parts[0] if parts and parts[0] in TIERS else None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if tier := tier_of(Path(item.path)):
            item.add_marker(getattr(pytest.mark, tier))


def pytest_runtest_logreport(report):
    recorder = durations.RECORDER
    if recorder is not None:
        recorder.add(report)


def pytest_sessionstart(session):
    if _is_controller(session.config):
        durations.RECORDER = session.config.stash[durations.KEY]


def pytest_sessionfinish(session, exitstatus):
    if not _is_controller(session.config):
        return
    recorder = session.config.stash[durations.KEY]
    workers = getattr(session.config.option, "numprocesses", None) or 0  # 0: the tests ran in this process
    wall_s = recorder.save(REPO_ROOT / "tests" / "durations.json", tier_of_nodeid, workers, whole_tier(session.config))
    ran = recorder.tiers_run(tier_of_nodeid)
    if ran == {"unit"} and wall_s > UNIT_BUDGET_S and exitstatus == 0:
        session.config.get_terminal_writer().line(
            f"the unit tier took {wall_s:.0f} s, over its budget of {UNIT_BUDGET_S} s: move what trains or starts a "
            "process to tests/integration or tests/e2e (tests/durations.json lists each test's cost)", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def whole_tier(config) -> str | None:
    """The tier this run is, when it runs one tier's folder whole (no -k or -m selection)."""
    if len(config.args) != 1 or config.option.keyword or config.option.markexpr:
        return None
    folder = Path(config.invocation_params.dir, config.args[0]).resolve()
    return folder.name if folder.parent == REPO_ROOT / "tests" and folder.name in TIERS else None


def tier_of_nodeid(nodeid: str) -> str | None:
    parts = nodeid.split("::")[0].split("/")
    return parts[1] if len(parts) > 1 and parts[0] == "tests" and parts[1] in TIERS else None


def _run_dir() -> Path:
    return Path(os.environ[RUN_DIR])


def built_once(name: str, build) -> Path:
    """`build(folder)` run by the first test process that asks, in the run's shared folder; the others wait for it
    and get the same folder. Builds replace their folder whole, so a finished one is never half-written."""
    from filelock import FileLock

    folder = _run_dir() / name
    with FileLock(str(_run_dir() / f"{name}.lock")):
        if not (folder / "config.json").is_file():
            build(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The "test" preset of the tiny Llama + tokenizer, built once per test run."""
    from tuneline.demo.tiny_model import TINY_PRESETS, build_tiny_model

    return built_once("tiny-model", lambda folder: build_tiny_model(folder, **TINY_PRESETS["test"]))


@pytest.fixture(scope="session")
def tiny_vlm():
    """`tiny_vlm("llava")`: the folder of a tiny vision-language preset, built once per test run."""
    from tuneline.demo.tiny_vlm import build_tiny_vlm

    return lambda preset: built_once(f"tiny-vlm-{preset}", lambda folder: build_tiny_vlm(folder, preset))


@pytest.fixture(scope="session")
def prefect_api():
    """The run's one Prefect API (tests.support.prefect_server), as this process's Prefect settings."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = prefect_server.api_url(_run_dir(), int(os.environ[CONTROLLER_PID]))
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield url


@pytest.fixture(scope="session")
def demo_data_dir() -> Path:
    """The repo's data/ folder: the demo datasets and their dataset_info.json."""
    return REPO_ROOT / "data"


@pytest.fixture(scope="session")
def empty_mlflow_store(tmp_path_factory) -> Path:
    """An MLflow SQLite file with its schema, created once: creating one is slow, copying it is not."""
    from mlflow import MlflowClient

    db = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}", registry_uri=f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture(scope="session")
def fake_checkpoint():
    """`write(folder, step)`: `folder/checkpoint-<step>` as a LoRA training leaves one (random adapter weights and
    trainer_state.json), for tests of logging, pruning and restoring checkpoints without training."""
    import json

    def write(folder: Path, step: int) -> Path:
        import torch
        from safetensors.torch import save_file

        ckpt = folder / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        save_file({"lora_A": torch.randn(4, 8), "lora_B": torch.randn(8, 4)}, str(ckpt / "adapter_model.safetensors"))
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        return ckpt

    return write


@pytest.fixture(scope="module")
def chaos():
    """benchmarks/chaos.py as a module: the fault suite's runs, kills and checks, shared with `make chaos`."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("chaos", Path(__file__).resolve().parents[1] / "benchmarks" /
                                                  "chaos.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module
