"""Fault suite (`make chaos`): kills, corrupts and fills the disk under real `python -m flows.finetune` processes,
or kills the MLflow or Prefect server they report to, then reruns the same command and checks nothing was lost
and the result is right. Prints a table: case, expected, observed, pass or fail.

Each case runs in a folder of its own (Prefect home, pipeline cache, output_dir, MLflow store) so that cache
records cannot leak between cases; a baseline run of the same config in another folder gives the metrics an
interrupted run must reach. The flow is started in a new session and killed as a whole process group
(os.killpg SIGKILL): the flow, its ephemeral Prefect server and the training child die together, as on a power
cut or an OOM kill.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from tuneline.content.step_cache import DAMAGED
from tuneline.runtime.contract import LOG_FILE, METRICS_SPOOL_DIR, RUN_FILE, die_with_parent, finished_run
from tuneline.train.checkpoints import STAGING_DIR
from tuneline.train.output_dir import unreadable_file
from tuneline.train.trainer_log import logged_metrics, read_log

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STEPS = ("load-tokenizer", "build-dataset", "build-reference-model", "train", "evaluate", "plot", "model-card")
# Both runs train the same steps from the same seed on the same CPU, but a resumed run restores the RNG and the
# optimizer from the checkpoint and replays the data order by skipping batches; float sums may then associate
# differently, so the comparison allows a few parts per million rather than demanding bit equality.
LOSS_TOLERANCE = 1e-4
TRACEBACK = "Traceback (most recent call last)"


@dataclass
class Outcome:
    case: str
    expected: str
    observed: str
    passed: bool


def tiny_config(root: Path, model_dir: Path, **changes) -> Path:
    """The flow tests' tiny SFT LoRA config, with checkpoints every few steps and a held-out split."""
    values = {
        "model_name_or_path": str(model_dir), "stage": "sft", "finetuning_type": "lora", "lora_rank": 4,
        "dataset": "demo_sft", "eval_dataset": "demo_sft_eval", "dataset_dir": str(REPO / "data"),
        "template": "chatml", "cutoff_len": 64, "max_samples": 64, "output_dir": str(root / "out"),
        "max_steps": 12, "save_steps": 3, "logging_steps": 1, "per_device_train_batch_size": 4, "seed": 7,
        "pipeline_cache_dir": str(root / "cache"), "mlflow_tracking_uri": f"sqlite:///{root / 'mlflow.db'}",
        "mlflow_experiment": "chaos", "eval_max_samples": 4, "eval_max_new_tokens": 2, "run_name": "chaos",
        **changes,
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def flow_env(root: Path, **extra: str) -> dict[str, str]:
    """An isolated Prefect home (ephemeral server, results) per case, so cache records belong to that case."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    home = root / "prefect-home"
    return {**env, "PREFECT_HOME": str(home), "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(home / "results"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "INFO",
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180", **extra}  # a loaded machine starts slowly


class Flow:
    """`python -m flows.finetune CONFIG` in a new session, its output going to a log file."""

    def __init__(self, config: Path, log: Path, env: dict[str, str]):
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in wait/kill
        self.proc = subprocess.Popen([sys.executable, "-m", "flows.finetune", str(config)], cwd=REPO, env=env,
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill_tree(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._log.close()

    def wait(self, seconds: float) -> int:
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.kill_tree()
            return -9
        finally:
            self._log.close()

    def wait_until(self, condition: Callable[[], bool], seconds: float) -> bool:
        """Poll `condition` while the flow lives; False when the flow ended first or time ran out."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if condition():
                return True
            if self.proc.poll() is not None:
                return condition()
            time.sleep(0.05)
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A server process (MLflow's or Prefect's) on a fixed port of 127.0.0.1, leading a process group of its own:
    start() waits until `health` answers, kill() ends the whole group with SIGKILL (a crash: no shutdown), and
    start() again brings it back on the same port and store, as an operator restarting it would."""

    def __init__(self, cmd: list[str], url: str, health: str, log: Path, env: dict[str, str]):
        self.cmd, self.url, self.health, self.log, self.env, self.proc = cmd, url, health, log, env, None

    @classmethod
    def mlflow(cls, root: Path) -> Server:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        return cls([str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                    "--backend-store-uri", f"sqlite:///{root / 'mlflow-server.db'}",
                    "--artifacts-destination", str(root / "mlflow-artifacts")], url, f"{url}/health",
                   root / "mlflow-server.log",
                   {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # no job runner: starts faster

    @classmethod
    def prefect(cls, root: Path) -> Server:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
        env.update(PREFECT_HOME=str(root / "prefect-server"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
        url = f"http://127.0.0.1:{port}/api"
        return cls([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)], url,
                   f"{url}/health", root / "prefect-server.log", env)

    def start(self, seconds: float = 120) -> float:
        """Start it and wait until it answers; the seconds that took."""
        started = time.monotonic()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=die_with_parent)
        while time.monotonic() - started < seconds:
            try:
                with urllib.request.urlopen(self.health, timeout=1):
                    return time.monotonic() - started
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"{self.cmd[0]} did not answer: {self.log.read_text(errors='replace')[-1000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def run_to_end(config: Path, root: Path, name: str, seconds: float = 600, **env: str) -> tuple[int, str]:
    flow = Flow(config, root / f"{name}.log", flow_env(root, **env))
    code = flow.wait(seconds)
    return code, flow.output()


def step_states(output: str) -> dict[str, list[str]]:
    """Each step's final states from the flow's own lines ("Task run 'train sft-lora' - Finished in state Cached")."""
    states: dict[str, list[str]] = {}
    for name, state in re.findall(r"Task run '([a-z-]+)[^']*' - Finished in state (\w+)", output):
        states.setdefault(name, []).append(state)
    return states


def finished_task_runs(output: str) -> list[str]:
    """The task runs ("evaluate base", "evaluate tuned", ...) that finished, Completed or Cached: a step such as
    evaluate has several, and a kill between them leaves some to compute on the rerun."""
    return [name for name, state in re.findall(r"Task run '([^']*)' - Finished in state (\w+)", output)
            if state in ("Completed", "Cached")]


def finished_steps(output: str) -> list[str]:
    """Steps whose every run finished (Completed or Cached) before the flow died."""
    return [s for s in STEPS if s in (states := step_states(output))
            and all(state in ("Completed", "Cached") for state in states[s])]


def tracked(root: Path) -> tuple[int, dict[str, float], dict[int, float]]:
    """(number of MLflow runs in the experiment, the last run's metrics, its per-step training loss)."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("chaos")
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    if not runs:
        return 0, {}, {}
    losses = {m.step: m.value for m in client.get_metric_history(runs[0].info.run_id, "loss")}
    return len(runs), dict(runs[0].data.metrics), losses


def final_weights(out: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    files = sorted(out.glob("*.safetensors"))
    return {f"{f.name}:{k}": v for f in files for k, v in load_file(f).items()}


def differences(root: Path, baseline: Path) -> list[str]:
    """What differs from the uninterrupted run: the loss at every step, every final_eval_* metric, the weights.

    HF's summary `train_loss` is left out: a resumed Trainer averages it over the steps of its own process only, so
    it differs by design although every step's loss is the same."""
    _, metrics, losses = tracked(root)
    _, want, want_losses = tracked(baseline)
    problems = []
    if sorted(losses) != sorted(want_losses):
        problems.append(f"loss logged at steps {sorted(losses)} vs {sorted(want_losses)}")
    problems += [f"loss at step {k} {losses[k]} vs {v}" for k, v in want_losses.items()
                 if k in losses and abs(losses[k] - v) > LOSS_TOLERANCE * max(1.0, abs(v))]
    problems += [f"{k} {metrics.get(k)} vs {v}" for k, v in want.items() if k.startswith("final_eval_")
                 and (metrics.get(k) is None or abs(metrics[k] - v) > LOSS_TOLERANCE * max(1.0, abs(v)))]
    weights, want_weights = final_weights(root / "out"), final_weights(baseline / "out")
    if sorted(weights) != sorted(want_weights):
        problems.append("different weight tensors")
    else:
        worst = max((float((weights[k] - v).abs().max()) for k, v in want_weights.items()), default=0.0)
        if worst > LOSS_TOLERANCE:
            problems.append(f"weights differ by up to {worst:.2g}")
    return problems


class Suite:
    def __init__(self, workdir: Path, model_dir: Path):
        self.workdir = workdir
        self.model_dir = model_dir
        self._baselines: dict[str, Path] = {}
        self._seconds: dict[str, float] = {}  # how long each baseline's command took, start to exit

    def folder(self, case: str) -> Path:
        path = self.workdir / re.sub(r"[^a-z0-9]+", "-", case.split(" (")[0].lower()).strip("-")
        path.mkdir(parents=True, exist_ok=True)
        return path

    def baseline(self, **changes) -> Path:
        """The folder of an uninterrupted run of the config (memoised per config change)."""
        tag = json.dumps(changes, sort_keys=True)
        if tag not in self._baselines:
            root = self.folder(f"baseline-{len(self._baselines)}")
            started = time.monotonic()
            code, output = run_to_end(tiny_config(root, self.model_dir, **changes), root, "run")
            if code != 0:
                raise RuntimeError(f"the baseline run failed:\n{output[-3000:]}")
            self._baselines[tag], self._seconds[tag] = root, time.monotonic() - started
        return self._baselines[tag]

    def baseline_seconds(self, **changes) -> float:
        """How long the uninterrupted command took on this machine: fixed-time kills are fractions of it, so they
        land inside the run on a fast machine and a loaded one alike."""
        self.baseline(**changes)
        return self._seconds[json.dumps(changes, sort_keys=True)]

    def kill_and_rerun(self, case: str, point: Callable[[Path], bool],
                       hook: Callable[[Path], dict[str, str]] | None = None, **changes) -> Outcome:
        """SIGKILL the flow's process group once `point(root)` holds, rerun the same command, check the result."""
        expected = (f"rerun completes; loss per step, final eval metrics and weights = uninterrupted run (within "
                    f"{LOSS_TOLERANCE:g}); steps finished before the kill Cached; 1 MLflow run")
        baseline = self.baseline(**changes)
        root = self.folder(case)
        config = tiny_config(root, self.model_dir, **changes)
        flow = Flow(config, root / "killed.log", flow_env(root, **(hook(root) if hook else {})))
        reached = flow.wait_until(lambda: point(root), 300)
        flow.kill_tree()
        if not reached:
            return Outcome(case, expected, "the kill point was never reached (flow ended first)", False)
        before, runs_before = finished_steps(flow.output()), finished_task_runs(flow.output())
        code, output = run_to_end(config, root, "rerun")
        if code != 0:
            return Outcome(case, expected, f"rerun exited {code}: {output[-300:]!r}", False)
        cached = set(re.findall(r"Task run '([^']*)' - Finished in state Cached", output))
        recomputed = [run for run in runs_before if run not in cached]
        runs = tracked(root)[0]
        problems = differences(root, baseline) + (["a traceback in the rerun's output"] if TRACEBACK in output else [])
        resumed = (json.loads((root / "out" / "run.json").read_text()).get("resumed_step")
                   if (root / "out" / "run.json").is_file() else None)
        observed = [f"killed after {', '.join(before) or 'no step'} finished",
                    f"rerun exit 0, recomputed: {', '.join(recomputed) or 'none'}",
                    f"train resumed at step {resumed}" if resumed else "train started at step 0",
                    f"{runs} MLflow run(s)", "equal to uninterrupted" if not problems else "; ".join(problems)]
        return Outcome(case, expected, "; ".join(observed), not problems and not recomputed and runs == 1)


    def run_then_damage(self, case: str, damage: Callable[[Path], str], expect: str,
                        check: Callable[[Path, str], list[str]], stop_at: Callable[[Path], bool] | None = None,
                        rebuilt: tuple[str, ...] = (), **changes) -> Outcome:
        """Run the flow (to its end, or killed at `stop_at`), damage a stored file, rerun: `check(root, output)`
        lists what is wrong with the rerun besides its metrics, which must equal an uninterrupted run's, and
        steps finished by the first run must be Cached (but those in `rebuilt`)."""
        expected = (f"{expect}; no other finished step recomputed; rerun completes with loss per step, eval "
                    "metrics and weights = uninterrupted run; 1 MLflow run")
        baseline = self.baseline(**changes)
        root = self.folder(case)
        config = tiny_config(root, self.model_dir, **changes)
        flow = Flow(config, root / "first.log", flow_env(root))
        if stop_at is None:
            flow.wait(600)
        else:
            flow.wait_until(lambda: stop_at(root), 300)
            flow.kill_tree()
        before = [step for step in finished_steps(flow.output()) if step not in rebuilt]
        damaged = damage(root)
        code, output = run_to_end(config, root, "rerun")
        if code != 0:
            return Outcome(case, expected, f"truncated {damaged}; rerun exited {code}: {output[-300:]!r}", False)
        states = step_states(output)
        problems = [f"{step} recomputed" for step in before if set(states.get(step, [])) != {"Cached"}]
        problems += check(root, output) + differences(root, baseline)
        if (runs := tracked(root)[0]) != 1:
            problems.append(f"{runs} MLflow runs")
        return Outcome(case, expected, f"truncated {damaged}; rerun exit 0; " + (
            "; ".join(problems) if problems else "all as expected"), not problems)


    def disk_full(self, case: str) -> Outcome:
        """output_dir on a small tmpfs; once a checkpoint is saved the rest of it is filled, so the next save
        meets ENOSPC (a real full disk, not a simulated error). Then the filler is removed and the command rerun."""
        expected = ("a clear error naming the full disk; the previous checkpoint intact; once space is freed the "
                    "rerun resumes and equals an uninterrupted run")
        baseline = self.baseline()
        root = self.folder("disk-full")
        out = root / "out"
        out.mkdir(exist_ok=True)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(out)], capture_output=True,
                                 text=True)
        if mounted.returncode != 0:
            return Outcome(case, expected, f"not run: no size-limited folder here ({mounted.stderr.strip()})", False)
        try:
            config = tiny_config(root, self.model_dir)
            flow = Flow(config, root / "first.log", flow_env(root))
            flow.wait_until(lambda: has_checkpoint(root), 300)
            filler = out / "filler"
            fill(filler)
            code = flow.wait(300)
            output = flow.output()
            kept = checkpoints(out)
            intact = bool(kept) and unreadable_file(kept[-1]) is None
            # the message the user is left with: from the flow's last "error:" line to the end
            message = output[output.rfind("\nerror:") + 1:] if "\nerror:" in output else ""
            clear = re.search(r"No space left on device|ENOSPC|disk is full", message)
            in_log = re.search(r"OSError: \[Errno 28\] No space left on device", output)
            filler.unlink()
            code2, output2 = run_to_end(config, root, "rerun")
            resumed = json.loads((out / "run.json").read_text()).get("resumed_step") if code2 == 0 else None
            problems = differences(root, baseline) if code2 == 0 else [f"rerun exited {code2}: {output2[-300:]!r}"]
        finally:
            subprocess.run(["umount", "-l", str(out)], check=False)
        first_line = message.splitlines()[0][:120] if message else "no error message"
        observed = [f"first run exit {code}, ends with {first_line!r}, which "
                    + ("names the full disk" if clear else "does not name the full disk")
                    + (" (the training's traceback in the log above it does: OSError ENOSPC)" if in_log and not clear
                       else ""),
                    f"{kept[-1].name if kept else 'no checkpoint'} {'intact' if intact else 'DAMAGED or missing'}",
                    f"rerun resumed at step {resumed}" if resumed else "rerun did not resume",
                    "equal to uninterrupted" if not problems else "; ".join(problems)]
        return Outcome(case, expected, "; ".join(observed),
                       code != 0 and bool(clear) and intact and bool(resumed) and not problems)

    def mlflow_server_restarted(self, case: str) -> Outcome:
        """The flow logs to a real `mlflow server`, which is killed (SIGKILL) once training has logged a few steps
        and started again on the same port and backend after a checkpoint was saved without it. The training's
        metric spool must bridge the gap: every (metric, step) of trainer_log.jsonl in the run's history, once."""
        expected = ("training goes on while MLflow is down; flow exit 0; every metric of every step in "
                    "trainer_log.jsonl in the run's MLflow history exactly once, none extra; spool empty")
        root = self.folder(case)
        server = Server.mlflow(root)
        server.start()
        try:
            config = tiny_config(root, self.model_dir, mlflow_tracking_uri=server.url, **MLFLOW_CASE_TRAIN)
            flow = Flow(config, root / "run.log", flow_env(root))
            if not flow.wait_until(lambda: last_step(root) >= SERVER_KILL_STEP, 300):
                flow.kill_tree()
                return Outcome(case, expected, "the kill point was never reached (flow ended first)", False)
            server.kill()
            down_at = last_step(root)
            saved = flow.wait_until(lambda: any(int(p.name.split("-")[1]) > down_at
                                                for p in checkpoints(root / "out")), 300)
            back_from = last_step(root)
            restart_s = server.start()
            back_at = last_step(root)
            code = flow.wait(300)
            output = flow.output()
            problems = history_against_log(root, server.url)
        finally:
            server.kill()
        spooled = sorted(p.name for p in (root / "out" / METRICS_SPOOL_DIR).glob("*")) if code == 0 else []
        total = max(MLFLOW_CASE_TRAIN["max_steps"], last_step(root))
        observed = [f"server killed at step {down_at}, restarted at step {back_from} "
                    + ("after a checkpoint saved without it" if saved else "(no checkpoint saved without it)")
                    + f", answering again at step {back_at} of {total} ({restart_s:.0f} s to start)",
                    f"flow exit {code}" + ("" if code == 0 else f": {output[-300:]!r}"),
                    "spool left: " + ", ".join(spooled) if spooled else "spool empty",
                    "; ".join(problems) if problems else "MLflow history = trainer_log.jsonl, each step once"]
        return Outcome(case, expected, "; ".join(observed), code == 0 and saved and not spooled and not problems)

    def prefect_server_lost(self, case: str) -> Outcome:
        """The flow reports to a real `prefect server start`, which is killed (SIGKILL) once training has logged a
        few steps and stays down until the flow process ends (or, having ended its flow run, is killed after
        EXIT_GRACE_S). Then the server is started again (same port and database) and the same command rerun:
        `train` must be found done, not trained again."""
        expected = ("training finishes; trained model and checkpoints in output_dir complete and readable; train's "
                    "result stored for the cache; with the server back the same command completes with train "
                    "Cached (or kept as finished), nothing retrained; 1 MLflow run")
        root = self.folder(case)
        out = root / "out"
        server = Server.prefect(root)
        server.start()
        try:
            config = tiny_config(root, self.model_dir, **PREFECT_CASE_TRAIN)
            flow = Flow(config, root / "first.log", flow_env(root, PREFECT_API_URL=server.url))
            if not flow.wait_until(lambda: last_step(root) >= SERVER_KILL_STEP, 300):
                flow.kill_tree()
                return Outcome(case, expected, "the kill point was never reached (flow ended first)", False)
            server.kill()
            down_at = last_step(root)
            flow.wait_until(lambda: FLOW_RUN_ENDED.search(flow.output()) is not None, 300)
            ended = time.monotonic()
            code = flow.wait(EXIT_GRACE_S)
            lingered = time.monotonic() - ended
            output = flow.output()
            finished, trained_to = finished_run(out), last_step(root)
            complete, key = finished is not None, (finished or {}).get("train_key", "")
            stored = bool(key) and (root / "cache" / "prefect-results" / key).is_file()
            damaged = unreadable_file(out) if (out / "trainer_state.json").is_file() else "no trainer_state.json"
            log_before = (out / LOG_FILE).read_bytes() if (out / LOG_FILE).is_file() else b""
            server.start()
            code2, output2 = run_to_end(config, root, "rerun", PREFECT_API_URL=server.url)
        finally:
            server.kill()
        train = step_states(output2).get("train", ["not run"])
        retrained = (out / LOG_FILE).read_bytes() != log_before
        kept = train == ["Completed"] and "the finished training is kept" in output2
        runs = tracked(root)[0]
        ending = FLOW_RUN_ENDED.search(output)
        observed = [f"server killed at step {down_at}",
                    f"training reached step {trained_to}, {RUN_FILE} " + ("complete" if complete else "NOT complete"),
                    f"output_dir and {len(checkpoints(out))} checkpoints "
                    + ("readable" if damaged is None else f"DAMAGED ({damaged})"),
                    f"steps finished: {', '.join(finished_steps(output)) or 'none'}",
                    ("flow run then " + (ending.group(1) if ending else "never ended")
                     + (f", process exit {code}" if code != -9 else
                        f", process still alive {lingered:.0f} s later (Prefect draining its events to the dead "
                        "server at exit): killed")),
                    "train's result stored for the cache" if stored else "train's result NOT stored for the cache",
                    f"rerun exit {code2}, train {'/'.join(train)}"
                    + (" (its key had changed; found finished in output_dir and kept)" if kept else "")
                    + (", RETRAINED (trainer_log.jsonl rewritten)" if retrained else ", nothing retrained"),
                    f"{runs} MLflow run(s)"]
        passed = (complete and damaged is None and stored and code2 == 0 and (train == ["Cached"] or kept)
                  and not retrained and runs == 1)
        return Outcome(case, expected, "; ".join(observed), passed)


def fill(path: Path) -> None:
    """Write zeros to `path` until its file system is full (unbuffered: the error comes from the write itself)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                continue
    finally:
        os.close(fd)


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def checkpoints(out: Path) -> list[Path]:
    return sorted((p for p in out.glob("checkpoint-*") if (p / "trainer_state.json").is_file()),
                  key=lambda p: int(p.name.split("-")[1]))


def damage_last_checkpoint(root: Path) -> str:
    last = checkpoints(root / "out")[-1]
    [weights] = last.glob("*.safetensors")
    truncate(weights)
    return f"{last.name}/{weights.name}"


def check_checkpoint_set_aside(root: Path, output: str) -> list[str]:
    problems = []
    aside = sorted(root.glob("out.superseded-*"))
    if not aside or not list(aside[-1].glob("checkpoint-*/*.safetensors")):
        problems.append("the damaged checkpoint was not set aside")
    if "adapter_model.safetensors does not read" not in output:
        problems.append("no warning naming the damaged file in the rerun's output")
    resumed = json.loads((root / "out" / "run.json").read_text()).get("resumed_step")
    if not resumed:
        problems.append("the rerun did not resume from the checkpoint before")
    return problems


def damage_dataset(root: Path) -> str:
    [entry] = [p for p in entries(root, "build-dataset") if not p.name.startswith(".")]
    [arrow] = (entry / "train").glob("*.arrow")
    truncate(arrow)
    return f"build-dataset/{entry.name[:8]}…/train/{arrow.name}"


def check_dataset_rebuilt(root: Path, output: str) -> list[str]:
    problems = []
    if not any(p.name.startswith(DAMAGED) for p in entries(root, "build-dataset")):
        problems.append("the damaged entry was not set aside")
    if not re.search(r"cache entry '[^']*build-dataset[^']*' is damaged \(train/data-[^ ]*\.arrow does not read",
                     output):
        problems.append("no warning naming the damaged file in the rerun's output")
    if set(step_states(output).get("build-dataset", [])) != {"Completed"}:
        problems.append(f"build-dataset {step_states(output).get('build-dataset')} (expected rebuilt: Completed)")
    return problems


def last_step(root: Path) -> int:
    """The last training step trainer_log.jsonl holds (0 before the first)."""
    steps = [entry.get("current_steps") for entry in read_log(root / "out" / LOG_FILE)]
    return max((s for s in steps if isinstance(s, int)), default=0)


def history_against_log(root: Path, uri: str) -> list[str]:
    """Each metric's steps in the MLflow run's history against the steps trainer_log.jsonl logged it at: what is
    missing, logged twice, or extra (a step the trainer never logged)."""
    from mlflow import MlflowClient

    logged: dict[str, set[int]] = {}
    for entry in read_log(root / "out" / LOG_FILE):
        for key in logged_metrics(entry):
            logged.setdefault(key, set()).add(entry["current_steps"])
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("chaos").experiment_id])
    if len(runs) != 1:
        return [f"{len(runs)} MLflow runs"]
    problems, counted = [], 0
    for key, steps in sorted(logged.items()):
        history = Counter(m.step for m in client.get_metric_history(runs[0].info.run_id, key))
        counted += len(steps)
        missing, extra = sorted(steps - set(history)), sorted(set(history) - steps)
        twice = sorted(step for step, n in history.items() if n > 1)
        problems += [f"{key}: {what} at steps {found[:8]}{'…' if len(found) > 8 else ''}"
                     for what, found in (("missing", missing), ("twice", twice), ("extra", extra)) if found]
    if not counted:
        problems.append("trainer_log.jsonl logged nothing")
    return problems


def has_checkpoint(root: Path) -> bool:
    out = root / "out"
    return out.is_dir() and any(p.name.startswith("checkpoint-") and (p / "trainer_state.json").is_file()
                                for p in out.iterdir())


def entries(root: Path, step: str) -> list[Path]:
    folder = root / "cache" / step
    return list(folder.iterdir()) if folder.is_dir() else []


def writing(root: Path, step: str) -> bool:
    """A step's cache entry is being written (its temporary `.tmp-` folder exists)."""
    return any(p.name.startswith(".tmp-") for p in entries(root, step))


# Test-only hook for the checkpoint-save case: a tiny model's checkpoint is written in milliseconds, too fast to
# be caught from outside, so the training process (via this sitecustomize on PYTHONPATH) pauses before publishing
# each staged checkpoint by renaming it into place. Nothing else changes: the kill lands between write and publish.
SLOW_PUBLISH = """import os, time
_replace = os.replace
def _slow_replace(src, dst, *args, **kwargs):
    if "/.partial/" in str(src):
        time.sleep(2)
    return _replace(src, dst, *args, **kwargs)
os.replace = _slow_replace
"""


def slow_publish_env(root: Path) -> dict[str, str]:
    hook = root / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(SLOW_PUBLISH)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))}


# Test-only hook for the window between the training child's end and the flow's record of it: a tiny training
# exits in milliseconds after marking run.json complete, so the child (via this sitecustomize) lingers at exit; the
# kill then lands after the training finished and before the flow stored the train step's result.
LINGER_AT_EXIT = """import atexit, sys, time
def _linger():
    if sys.argv and sys.argv[0].endswith("tuneline/train/__main__.py"):
        time.sleep(30)
atexit.register(_linger)
"""


def linger_at_exit_env(root: Path) -> dict[str, str]:
    hook = root / "exit-hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(LINGER_AT_EXIT)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))}


def training_finished(root: Path) -> bool:
    """run.json says the training is complete (the child's mark), whether or not the flow recorded it yet."""
    return finished_run(root / "out") is not None


# Test-only hook for the store-creation case: MLflow builds a new SQLite store's schema in about a second, so the
# process creating it (via this sitecustomize, through SQLAlchemy's public event API) marks the instant a schema
# migration has made its work table and pauses there; the kill lands mid-migration, where it once left a store that
# no later start could open.
PAUSE_STORE_MIGRATION = """import os, time
from pathlib import Path
from sqlalchemy import event
from sqlalchemy.engine import Engine

@event.listens_for(Engine, "after_cursor_execute")
def _pause(conn, cursor, statement, *args):
    if "mlflow.db" in str(conn.engine.url) and statement.lstrip().upper().startswith("CREATE TABLE _ALEMBIC_TMP_"):
        Path(os.environ["TUNELINE_CHAOS_MARK"]).touch()
        time.sleep(30)
"""
MIGRATING = "store-migrating"  # the mark the hook leaves, in the case's folder


def pause_store_migration_env(root: Path) -> dict[str, str]:
    hook = root / "store-hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(PAUSE_STORE_MIGRATION)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])),
            "TUNELINE_CHAOS_MARK": str(root / MIGRATING)}


def migrating_store(root: Path) -> bool:
    return (root / MIGRATING).exists()


def saving_checkpoint(root: Path) -> bool:
    """A checkpoint is being written into the staging folder, after a first one was published."""
    staging = root / "out" / STAGING_DIR
    return has_checkpoint(root) and staging.is_dir() and any(staging.iterdir())


DPO = {"stage": "dpo", "dataset": "demo_pref", "eval_dataset": "demo_pref_eval", "max_samples": 256,
       "cutoff_len": 128, "max_steps": 6, "save_steps": 2}
# tokenization long enough to be caught: more rows, longer rows
BIG_DATA = {"max_samples": 2000, "cutoff_len": 256}
# a training long enough (tens of seconds here) for MLflow's server to be killed and started again while it runs
MLFLOW_CASE_TRAIN = {"max_steps": 300, "save_steps": 60}
PREFECT_CASE_TRAIN = {"max_steps": 100, "save_steps": 30}  # the Prefect case only needs the kill to land mid-train
SERVER_KILL_STEP = 20
FLOW_RUN_ENDED = re.compile(r"Flow run '[^']*' - (Encountered exception|Finished in state \w+)")
EXIT_GRACE_S = 15  # how long a flow process may take to exit once its flow run ended
def step_finished(step: str) -> Callable[[Path], bool]:
    """The instant the flow's log says `step` finished: a kill at the boundary before the next step."""
    return lambda root: step in finished_steps(_killed_log(root))


def _killed_log(root: Path) -> str:
    path = root / "killed.log"
    return path.read_text(errors="replace") if path.is_file() else ""


def file_written(*parts: str) -> Callable[[Path], bool]:
    """The instant a file of the run (under the case's folder) appears."""
    return lambda root: root.joinpath(*parts).exists()


def seconds_in(seconds: float) -> Callable[[Path], bool]:
    """`seconds` after the first poll, which comes as the flow starts."""
    started: list[float] = []

    def reached(root: Path) -> bool:
        started.append(started[0] if started else time.monotonic())
        return time.monotonic() - started[0] >= seconds

    return reached


def card_written(root: Path) -> bool:
    """The model-card step has put its README.md in place (the trainer wrote one of its own before)."""
    card = root / "out" / "README.md"
    return card.is_file() and "fine-tuned by tuneline" in card.read_text(errors="replace")


def kill_at(name: str, point: Callable[[Path], bool], hook: Callable[[Path], dict[str, str]] | None = None,
            **changes) -> Callable[[Suite], Outcome]:
    return lambda suite: suite.kill_and_rerun(name, point, hook, **changes)


GRPO = {"stage": "grpo", "dataset": "demo_sft", "eval_dataset": None, "max_samples": 48, "max_steps": 6,
        "save_steps": 2, "num_generations": 4, "max_completion_length": 4, "reward_funcs": ["think_format"]}
MLLM_DATA = REPO / "tests" / "fixtures" / "llamafactory" / "0.9.5" / "data"
VLM_MODEL = "tiny-gemma3"  # built by main() beside the text model
VLM = {"template": "gemma3", "dataset": "mllm_demo", "dataset_dir": str(MLLM_DATA), "eval_dataset": None,
       "cutoff_len": 1024,  # room for each image's tokens, which a cut would split from their features
       "lora_target": "all", "max_samples": None, "max_steps": 4, "save_steps": 2, "per_device_train_batch_size": 2}


def vlm_kill(name: str, point: Callable[[Path], bool]) -> Callable[[Suite], Outcome]:
    return lambda suite: suite.kill_and_rerun(
        name, point, model_name_or_path=str(suite.model_dir.parent / VLM_MODEL), **VLM)


# The whole life of a run: each step boundary, each file it writes, the window between the training child's end
# and the flow's record, fixed times; then dpo, grpo and a vision-language sft at a few instants each.
INSTANTS: dict[str, Callable[[Suite], Outcome]] = {
    "kill while mlflow creates its store": kill_at("kill while MLflow creates its store (first run)",
                                                   migrating_store, pause_store_migration_env),
    **{f"kill after {step}": kill_at(f"kill after {step} finished", step_finished(step))
       for step in ("load-tokenizer", "build-dataset", "build-reference-model", "train", "evaluate", "plot")},
    "kill at run.json": kill_at("kill as run.json is first written", file_written("out", RUN_FILE)),
    **{f"kill at checkpoint-{n}": kill_at(f"kill as checkpoint-{n} is published",
                                          file_written("out", f"checkpoint-{n}", "trainer_state.json"))
       for n in (3, 6, 9, 12)},
    "kill at the final model": kill_at("kill as the final model is written",
                                       file_written("out", "adapter_model.safetensors")),
    "kill between child end and flow record": kill_at(
        "kill between the training child's end and the flow's record (child held at exit by a test-only hook)",
        training_finished, linger_at_exit_env),
    "kill at the trainer's readme": kill_at("kill as README.md first appears (the trainer's, as training ends)",
                                            file_written("out", "README.md")),
    "kill at the card": kill_at("kill as the model card is written (README.md becomes tuneline's)", card_written),
    **{f"kill at {p}% of the run": lambda suite, p=p: suite.kill_and_rerun(
        f"kill {p}% of the uninterrupted run's time into the run", seconds_in(p / 100 * suite.baseline_seconds()))
       for p in (20, 40, 60, 80)},
    "dpo: kill after build-reference-model": kill_at("dpo: kill after build-reference-model finished",
                                                     step_finished("build-reference-model"), **DPO),
    "dpo: kill at checkpoint-2": kill_at("dpo: kill as checkpoint-2 is published",
                                         file_written("out", "checkpoint-2", "trainer_state.json"), **DPO),
    "grpo: kill at checkpoint-2": kill_at("grpo: kill as checkpoint-2 is published",
                                          file_written("out", "checkpoint-2", "trainer_state.json"), **GRPO),
    "grpo: kill between child end and flow record": kill_at(
        "grpo: kill between the training child's end and the flow's record", training_finished, linger_at_exit_env,
        **GRPO),
    "vlm sft: kill after build-dataset": vlm_kill("vlm sft: kill after build-dataset finished",
                                                  step_finished("build-dataset")),
    "vlm sft: kill at checkpoint-2": vlm_kill("vlm sft: kill as checkpoint-2 is published",
                                              file_written("out", "checkpoint-2", "trainer_state.json")),
}
CASES: dict[str, Callable[[Suite], Outcome]] = {
    "kill mid-train": lambda s: s.kill_and_rerun("kill mid-train (after checkpoint-3)", has_checkpoint),
    "kill during checkpoint save": lambda s: s.kill_and_rerun(
        "kill during checkpoint save (publish slowed by a test-only hook)", saving_checkpoint, slow_publish_env),
    "kill during evaluation": lambda s: s.kill_and_rerun("kill during evaluation",
                                                         lambda root: bool(entries(root, "evaluate"))),
    "kill during tokenization": lambda s: s.kill_and_rerun("kill during tokenization (build-dataset)",
                                                           lambda root: writing(root, "build-dataset"), **BIG_DATA),
    "kill during reference precompute": lambda s: s.kill_and_rerun(
        "kill during reference precompute (dpo)", lambda root: writing(root, "build-reference-model"), **DPO),
    "truncated checkpoint": lambda s: s.run_then_damage(
        "truncated checkpoint (last checkpoint's safetensors cut in half)", damage_last_checkpoint,
        "detected, set aside with a warning naming the file, the checkpoint before resumed; never loaded",
        check_checkpoint_set_aside, stop_at=lambda root: len(checkpoints(root / "out")) >= 2),
    "truncated dataset cache": lambda s: s.run_then_damage(
        "truncated dataset cache (Arrow file of the built dataset cut in half)", damage_dataset,
        "detected, set aside with a warning naming the file, rebuilt; never loaded", check_dataset_rebuilt,
        rebuilt=("build-dataset",)),
    "disk full during checkpoint save": lambda s: s.disk_full("disk full during checkpoint save (8 MiB tmpfs)"),
    "mlflow server restarted": lambda s: s.mlflow_server_restarted(
        "MLflow server killed mid-train and restarted (same port and backend)"),
    "prefect server lost": lambda s: s.prefect_server_lost(
        "Prefect server killed mid-train (back only for the rerun)"),
    **INSTANTS,
}


def print_table(outcomes: list[Outcome]) -> str:
    rows = [("case", "expected", "observed", "result")] + [
        (o.case, o.expected, o.observed, "pass" if o.passed else "FAIL") for o in outcomes]
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "|---|---|---|---|")
    text = "\n".join(lines)
    print(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES), help=f"any of: {', '.join(CASES)}")
    parser.add_argument("--instants", action="store_true", help="only the kill instants over a run's life")
    parser.add_argument("--workdir", help="where the cases' folders go (default: a new temporary folder)")
    args = parser.parse_args(argv)
    if args.instants:
        args.cases = list(INSTANTS)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="tuneline-chaos-"))
    from tuneline.demo.tiny_model import TINY_PRESETS, build_tiny_model

    model_dir = workdir / "model"
    if not (model_dir / "config.json").is_file():
        build_tiny_model(model_dir, **TINY_PRESETS["test"])
    if any(name.startswith("vlm") for name in args.cases) and not (workdir / VLM_MODEL / "config.json").is_file():
        from tuneline.demo.tiny_vlm import build_tiny_vlm

        build_tiny_vlm(workdir / VLM_MODEL, "gemma3")
    suite = Suite(workdir, model_dir)
    outcomes = []
    for name in args.cases:
        started = time.monotonic()
        try:
            outcome = CASES[name](suite)
        except Exception as err:  # noqa: BLE001 - the table still shows every other case
            outcome = Outcome(name, "(see the case)", f"the harness failed: {type(err).__name__}: {err}", False)
        print(f"{name}: {'pass' if outcome.passed else 'FAIL'} ({time.monotonic() - started:.0f} s)", flush=True)
        outcomes.append(outcome)
    print(f"\nworking folder: {workdir}")
    print_table(outcomes)
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
