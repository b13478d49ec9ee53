"""`tuneline train` with no Prefect API configured: Prefect starts its own temporary server, in real processes."""

import os
import pty
import re
import subprocess
import sys

from tests.support.flows import REPO, tiny_config


def test_cli_train_runs_on_prefects_temporary_server(tmp_path, tiny_model_dir):
    """The path of `make demo`. Cached re-runs are tested against the test harness's API and a running server."""
    config = tiny_config(tmp_path, tiny_model_dir, max_steps=2, mlflow_experiment="cli-test")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(tmp_path / "home"), PREFECT_LOGGING_LEVEL="INFO",
               # Prefect gives its temporary server 20 s to start: too few beside a second test process
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120")
    env.update(COLUMNS="400", PREFECT_LOGGING_COLORS="false")  # on a terminal: whole lines, no colours
    returncode, output = run_on_a_terminal([sys.executable, "-m", "cli.main", "train", str(config)], env)
    assert returncode == 0, output[-3000:]
    assert "Starting temporary server" in output
    finished = re.findall(r"Task run '([\w-]+)[^']*' - Finished in state Completed", output)
    assert set(finished) == {"load-tokenizer", "build-dataset", "build-reference-model", "train", "evaluate", "plot",
                             "model-card"}, finished

    assert re.search(r"training 100%\|[^|]*\| 2/2 \[elapsed [^,]+, ETA [^,]+, loss \d", output), output[-3000:]

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("cli-test").experiment_id])
    assert run.data.tags["prefect.flow_run_id"]
    assert "prefect.flow_run_url" not in run.data.tags, "no link into a server that stopped with the run"


def run_on_a_terminal(cmd: list[str], env: dict[str, str], timeout: float = 600) -> tuple[int, str]:
    """(exit code, everything it wrote) of cmd run with a pseudo-terminal as its stdin, stdout and stderr, as a
    user's `tuneline train` in a shell: what only a terminal shows (the progress bar) is there."""
    import select
    import time

    leader, follower = pty.openpty()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([leader], [], [], 1.0)[0]:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the terminal closed: every process on it has exited
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    else:
        proc.kill()
    os.close(leader)
    text = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    return proc.wait(timeout=60), re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
