"""Against a running `prefect server start`, as in production: a deployment served by `tuneline serve` runs
the flow when triggered by `tuneline trigger` (and again, all cached, when triggered by `prefect deployment run`),
and a run whose process is killed is marked Crashed by Prefect.

The server, the serving process and the flow runs are real processes, each stopped by its pid; each also dies
with the test session if that is killed first.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from uuid import UUID

import pytest
import yaml

from tests.support.flows import REPO, STEPS, tiny_config
from tests.support.ports import free_port, wait_until_answers
from tuneline.runtime.contract import die_with_parent

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """`prefect server start` on 127.0.0.1 with a home of its own; yields its API URL."""
    home = tmp_path_factory.mktemp("prefect-server")
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    port = free_port()
    with open(home / "server.log", "wb") as log:
        server = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                  env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                  preexec_fn=lambda: die_with_parent(signal.SIGTERM))  # SIGTERM: it stops its server
    url = f"http://127.0.0.1:{port}/api"
    wait_until_answers(f"{url}/health", server, home / "server.log", 120, "prefect server start")
    yield url
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=30)


def stop_process_group(process: subprocess.Popen, grace_s: float = 30) -> None:
    """SIGTERM, then SIGKILL what is left after `grace_s` (a worker may linger over its shutdown)."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def api(url: str, call):
    """`await call(client)` with a Prefect client of the server at `url`."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    async def go():
        async with get_client() as client:
            return await call(client)

    with temporary_settings({PREFECT_API_URL: url}):
        return asyncio.run(go())


def wait_for_final_state(url: str, flow_run_id, seconds: float):
    deadline = time.monotonic() + seconds
    while True:
        run = api(url, lambda client: client.read_flow_run(flow_run_id))
        if run.state and run.state.is_final():
            return run
        assert time.monotonic() < deadline, f"flow run still {run.state.name if run.state else None}"
        time.sleep(1)


def task_states(url: str, flow_run_id) -> dict[str, list[str]]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    flow_runs = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
    deadline = time.monotonic() + 30
    while True:  # the server records task-run states from events, a moment after the flow run ends
        runs = api(url, lambda client: client.read_task_runs(flow_run_filter=flow_runs))
        if all(run.state and run.state.is_final() for run in runs) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    out: dict[str, list[str]] = {}
    for run in runs:
        out.setdefault(run.name.split(" ")[0], []).append(run.state.name if run.state else "no state")
    return out


def client_env(url: str, root: Path, **extra: str) -> dict:
    return {**os.environ, "PREFECT_API_URL": url, "PREFECT_HOME": str(root / "client-home"),
            "PREFECT_LOGGING_LEVEL": "INFO", **extra}


def test_a_deployment_served_by_tuneline_serve_runs_triggered_runs_and_a_second_is_all_cached(
        prefect_server, tmp_path, tiny_model_dir):
    """The config holds out no validation split, as LLaMA-Factory's examples do: the run trains and completes, and
    says everywhere that it was not evaluated."""
    config = tiny_config(tmp_path, tiny_model_dir, eval_dataset=None)
    spec = {"deployments": [{"name": "tiny-sft", "entrypoint": "flows/finetune.py:finetune", "tags": ["tuneline"],
                             "parameters": {"config_path": str(config), "overrides": []}}]}
    (tmp_path / "prefect.yaml").write_text(yaml.safe_dump(spec))
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    env = client_env(prefect_server, tmp_path, PREFECT_RUNNER_POLL_FREQUENCY="1")
    with open(tmp_path / "serve.log", "wb") as log:
        serving = subprocess.Popen([str(BIN / "tuneline"), "serve", str(tmp_path / "prefect.yaml")],
                                   cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                deployment = api(prefect_server, lambda c: c.read_deployment_by_name("finetune/tiny-sft"))
                break
            except Exception:  # noqa: BLE001 - not registered yet
                assert serving.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                time.sleep(0.5)
        commands = {"Completed": [str(BIN / "tuneline"), "trigger", deployment.name, "max_steps=4"],  # as configured
                    "Cached": [str(BIN / "prefect"), "deployment", "run", "finetune/tiny-sft"]}
        for expected, command in commands.items():
            printed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
            started = UUID(re.search(r"[0-9a-f]{8}-[0-9a-f-]{27}", printed).group(0))
            assert f"/runs/flow-run/{started}" in printed, printed  # both print the run's page
            started = api(prefect_server, lambda c, run_id=started: c.read_flow_run(run_id))
            assert started.deployment_id == deployment.id
            finished = wait_for_final_state(prefect_server, started.id, 600)
            assert finished.state.is_completed(), (tmp_path / "serve.log").read_text()[-4000:]
            states = task_states(prefect_server, started.id)
            assert set(states) == STEPS and all(set(s) == {expected} for s in states.values()), states
        summary = api(prefect_server, lambda c: c.read_artifacts(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[started.id]))))
        summary = next(a.data for a in summary if a.key == "run-summary")
        assert "Not evaluated: no validation split" in summary and "| rows truncated to cutoff_len 64 |" in summary
    finally:
        serving.terminate()
        serving.wait(timeout=60)
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("served").experiment_id])
    assert len(run.data.tags["tuneline.flow_run_ids"].split(",")) == 2, "both served runs recorded in one MLflow run"
    assert run.data.tags["prefect.flow_run_url"].startswith("http://127.0.0.1")
    assert run.data.tags["tuneline.evaluation"].startswith("skipped: no validation split")
    assert "data_truncated_rows" in run.data.metrics and "final_eval_loss" not in run.data.metrics
    assert "Not evaluated: no validation split" in (tmp_path / "out" / "README.md").read_text()


def test_a_killed_run_is_marked_crashed_by_prefect(prefect_server, tmp_path, tiny_model_dir):
    """SIGKILL leaves no word to the server; the flow's heartbeats stop, and the automation of
    orchestration.crash_detection marks the run Crashed after three missed ones. The flow installs it itself (the flow tests
    check that); here it is installed first, so that the run's first heartbeat already counts."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from orchestration.crash_detection import ensure_crash_detection

    with temporary_settings({PREFECT_API_URL: prefect_server, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}):
        ensure_crash_detection()

    config = tiny_config(tmp_path, tiny_model_dir, run_name="killed-mid-training", max_steps=100000, save_steps=5)
    env = client_env(prefect_server, tmp_path, PREFECT_FLOWS_HEARTBEAT_FREQUENCY="30")
    started = time.monotonic()
    # the flow's launcher and training die with it (tuneline.runtime.contract.die_with_parent), as it dies with us
    flow = subprocess.Popen([sys.executable, "-m", "flows.finetune", str(config)], cwd=REPO, env=env,
                            preexec_fn=die_with_parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        checkpoint = tmp_path / "out" / "checkpoint-5"
        while not checkpoint.is_dir():
            assert flow.poll() is None and time.monotonic() - started < 300, "no training to kill"
            time.sleep(0.5)
        by_name = FlowRunFilter(name=FlowRunFilterName(any_=["killed-mid-training"]))
        [running] = api(prefect_server, lambda c: c.read_flow_runs(flow_run_filter=by_name))
        assert running.state.is_running()
    finally:
        flow.kill()
        flow.wait()
    crashed = wait_for_final_state(prefect_server, running.id, 240)
    assert crashed.state.is_crashed() and "heartbeat" in crashed.state.message, crashed.state


def test_a_second_worker_with_the_shared_cache_finds_every_step_done(prefect_server, tmp_path, tiny_model_dir):
    """Two workers, as on two machines (each its own Prefect home), serve one work pool; the config's
    pipeline_cache_dir stands for the volume they share. Set up the README's way: a process work pool and
    `prefect deploy` of a prefect.yaml. The run that the second worker picks up is all cache hits."""
    config = tiny_config(tmp_path, tiny_model_dir)
    spec = {"name": "two-workers",
            "pull": [{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}],
            "deployments": [{"name": "shared-cache", "entrypoint": "flows/finetune.py:finetune",
                             "parameters": {"config_path": str(config), "overrides": []},
                             "work_pool": {"name": "two-workers"}}]}
    (tmp_path / "prefect.yaml").write_text(yaml.safe_dump(spec))
    env = client_env(prefect_server, tmp_path)
    for command in (["work-pool", "create", "--type", "process", "two-workers"],
                    ["deploy", "--all", "--prefect-file", str(tmp_path / "prefect.yaml")]):
        subprocess.run([str(BIN / "prefect"), "--no-prompt", *command], cwd=REPO, env=env, check=True,
                       capture_output=True)
    deployment = api(prefect_server, lambda c: c.read_deployment_by_name("finetune/shared-cache"))
    for worker, expected in (("first", "Completed"), ("second", "Cached")):
        home = tmp_path / f"{worker}-machine"
        worker_env = {**env, "PREFECT_HOME": str(home), "PREFECT_WORKER_QUERY_SECONDS": "1"}
        home.mkdir()
        with open(home / "worker.log", "wb") as log:
            process = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", "two-workers", "--name",
                                        worker], cwd=home, env=worker_env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, preexec_fn=die_with_parent)
        try:
            started = api(prefect_server, lambda c: c.create_flow_run_from_deployment(deployment.id))
            finished = wait_for_final_state(prefect_server, started.id, 600)
            assert finished.state.is_completed(), (home / "worker.log").read_text()[-4000:]
        finally:
            stop_process_group(process, grace_s=5)  # its run is over: nothing to lose
        assert str(started.id) in (home / "worker.log").read_text(), f"the {worker} worker ran it"
        states = task_states(prefect_server, started.id)
        assert set(states) == STEPS and all(set(s) == {expected} for s in states.values()), (worker, states)
