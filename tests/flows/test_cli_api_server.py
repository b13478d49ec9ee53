"""`tuneline train` without a configured Prefect API: the temporary server we start early, in real processes."""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import httpx
import psutil
import pytest
import yaml

from tuneline.pipeline.give_way import WATCHER_NICE

REPO = Path(__file__).resolve().parents[2]


def _env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    return {**env, "PREFECT_HOME": str(home), "PREFECT_LOGGING_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"}


def _answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _server_port(output: str) -> int:
    match = re.search(r"temporary API server on http://127\.0\.0\.1:(\d+)/api", output)
    assert match, output[-3000:]
    return int(match.group(1))


@pytest.mark.slow
def test_cli_train_runs_on_a_temporary_server_and_stops_it(tmp_path, tiny_model_dir):
    shutil.copytree(REPO / "data", tmp_path / "data")
    config = {
        "model_name_or_path": str(tiny_model_dir), "stage": "sft", "finetuning_type": "lora", "dataset": "demo_sft",
        "eval_dataset": "demo_sft_eval", "dataset_dir": str(tmp_path / "data"), "template": "chatml",
        "cutoff_len": 64, "max_samples": 64, "output_dir": str(tmp_path / "out"), "max_steps": 2,
        "per_device_train_batch_size": 8, "pipeline_cache_dir": str(tmp_path / "cache"),
        "mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "mlflow_experiment": "cli-test",
        "mlflow_registered_model": None, "eval_max_samples": 4, "eval_max_new_tokens": 2,
    }
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "flows.cli", "train", str(path)]
    runs = [subprocess.run(command, cwd=REPO, env=_env(tmp_path / "home"), capture_output=True, text=True,
                           timeout=600) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
        assert not _answers(_server_port(run.stderr)), "the temporary server must stop with the run"
        assert "View at" not in run.stderr, "no links into a server that has stopped"
    assert "started early" in runs[0].stderr, "the training launch starts while the flow does (first run too)"
    cached = re.findall(r"Task run '([\w-]+)[^']*' - Finished in state Cached", runs[1].stderr)
    assert set(cached) >= {"load-tokenizer", "build-dataset", "train", "evaluate", "plot", "model-card"}, cached

    from mlflow import MlflowClient

    client = MlflowClient(config["mlflow_tracking_uri"])
    [run] = client.search_runs([client.get_experiment_by_name("cli-test").experiment_id])
    assert run.data.tags["prefect.flow_run_id"] and "prefect.flow_run_url" not in run.data.tags


def test_temporary_server_dies_with_a_killed_parent(tmp_path):
    """It also gives way to a training for the CPU, as the parent's watching threads do (tuneline.pipeline.give_way)."""
    script = ("import os, time\nfrom flows.api_server import prefect_api\n"
              "from tuneline.pipeline.give_way import watchers_give_way\n"
              "with prefect_api() as url, watchers_give_way() as lowered:\n"
              "    print('READY', {pid for pid, _ in lowered} - {os.getpid()}, url, flush=True)\n"
              "    time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=_env(tmp_path), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = parent.stdout.readline()
    assert line.startswith("READY"), parent.stderr.read()[-3000:] if parent.poll() is not None else line
    port = int(line.rsplit(":", 1)[1].split("/")[0])
    assert _answers(port)
    if sys.platform.startswith("linux"):
        [server] = [psutil.Process(int(pid)) for pid in re.findall(r"\d+", line.split("}")[0])]
        assert "flows.temporary_server" in server.cmdline() and server.nice() == WATCHER_NICE
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 30
    while _answers(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _answers(port), "the server outlived its killed parent"


def test_no_temporary_server_where_prefect_settings_rule_it_out(tmp_path):
    """Spawned before Prefect's settings are read, the server is stopped at once when they say not to use one."""
    script = ("import os, pathlib\nfrom flows.api_server import prefect_api\n"
              "def children():\n"
              "    found = []\n"
              "    for stat in pathlib.Path('/proc').glob('[0-9]*/stat'):\n"
              "        try:\n            fields = stat.read_text().split()\n"
              "        except OSError:\n            continue\n"
              "        found += [fields[0]] if fields[3] == str(os.getpid()) else []\n"
              "    return found\n"
              "with prefect_api() as url:\n    print('URL', url, 'CHILDREN', len(children()), flush=True)\n")
    env = {**_env(tmp_path), "PREFECT_SERVER_EPHEMERAL_ENABLED": "false"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "URL None CHILDREN 0" in done.stdout, done.stdout
    assert "temporary API server" not in done.stderr


def test_no_heartbeats_to_a_temporary_server(tmp_path):
    """Heartbeats let a lasting server mark a dead run crashed; one that stops with the run gets none (and the
    run's end no longer waits on their thread). A configured API keeps Prefect's setting."""
    script = ("import sys, threading\nfrom prefect import flow\nfrom prefect.settings import get_current_settings\n"
              "from flows.api_server import prefect_api\n"
              "def heartbeat_threads():\n"
              "    return [t for t in threading.enumerate()\n"
              "            if any(getattr(a, '__name__', '') == 'heartbeat_loop' for a in getattr(t, '_args', ()))]\n"
              "@flow\ndef probe():\n    return len(heartbeat_threads())\n"
              "with prefect_api() as url:\n"
              "    print('HEARTBEAT', get_current_settings().flows.heartbeat_frequency, flush=True)\n"
              "    if sys.argv[1:] == ['--run-a-flow']:\n"
              "        print('THREADS', probe(), flush=True)\n")
    temporary = subprocess.run([sys.executable, "-c", script, "--run-a-flow"], cwd=REPO, env=_env(tmp_path),
                               capture_output=True, text=True, timeout=300)
    assert temporary.returncode == 0, temporary.stderr[-3000:]
    assert "temporary API server" in temporary.stderr
    assert "HEARTBEAT None" in temporary.stdout and "THREADS 0" in temporary.stdout, temporary.stdout
    configured = {**_env(tmp_path), "PREFECT_API_URL": "http://127.0.0.1:9/api"}  # no flow run: not contacted
    lasting = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=configured, capture_output=True,
                             text=True, timeout=300)
    assert lasting.returncode == 0, lasting.stderr[-3000:]
    assert "HEARTBEAT 180" in lasting.stdout, lasting.stdout


def _wakeups(pid: int) -> int:
    """Times the process's threads went to sleep and woke again (voluntary context switches), all threads."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += sum(int(line.split()[1]) for line in (task / "status").read_text().splitlines()
                         if line.startswith("voluntary_ctxt_switches"))
    return total


def test_temporary_server_keeps_still_while_nothing_happens(tmp_path):
    """Training on a CPU pays for each wakeup of the server beside it. Prefect's app as `uvicorn --factory` runs it
    woke ~170 times a second with nothing to do (docket's worker polling, uvicorn's ten ticks a second); ours
    answers requests and otherwise keeps still (~35 a second here, from Prefect's own services)."""
    from flows.api_server import _start_server, _stop, _wait_until_healthy

    env = _env(tmp_path)
    with mock.patch.dict(os.environ, env, clear=True):
        server, url = _start_server()
    try:
        _wait_until_healthy(server, url, timeout=120)
        time.sleep(2)  # start-up work done
        before, started = _wakeups(server.pid), time.monotonic()
        time.sleep(3)
        rate = (_wakeups(server.pid) - before) / (time.monotonic() - started)
        assert httpx.get(f"{url}/health").status_code == 200
    finally:
        _stop(server)
    assert rate < 80, f"the idle temporary server woke {rate:.0f} times a second"
    assert server.returncode == -signal.SIGTERM, "it stops on SIGTERM, closing its database, and is not killed"
