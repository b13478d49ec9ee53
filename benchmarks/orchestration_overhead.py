"""What the flow costs on top of training, and how fast a fully cached re-run is.

    .venv/bin/python benchmarks/orchestration_overhead.py [--steps 1500] [--pairs 3] [--no-server]

The same SFT LoRA training runs (a) through the bare entry point `python -m tuneline.train` and (b) through
`tuneline train` (the Prefect flow on its temporary API server: seven steps, MLflow run, evaluation, plots, model
card), and (c) through `tuneline train` against a running `prefect server start`, in `--pairs` rounds of a-b-c
back to back (b-c-a, c-a-b in the next: a run's place in the round seemed to matter): this machine's speed drifts
by 10-20% within minutes, so each flow run is compared with the bare run of its round and the medians of those
paired differences are printed. A 1-step flow run comes first, as a user's first run (it creates the MLflow and
Prefect databases, tokenizes and scores the base model), so (b) and (c) are the steady state of retraining; the
one-off cost is printed on its own line.

Each run's extra time splits into a fixed part (wall time outside the training loop's steady state, from its first
logged step to its end) and a per-step part: what the flow's own processes (the command, which also sends the step
metrics to MLflow, and Prefect's server) and the child's background threads take from training, measured as their
share of this machine's CPU while the loop runs (the loop times themselves vary too much run to run to show a 1%
difference), from the first trainer_log.jsonl entry to the loop's end, split by the threads' nice value: while
training runs, the flow lowers its watching threads and its temporary server to nice 19
(`tuneline.pipeline.give_way`). The running server idles through every round, bare runs included (~1% of this
machine: its task scheduler polls four times a second), so each kind's share counts it and the bare runs' share is
subtracted: what remains is what the flow adds. A share of the CPU at the training's priority costs the loop more
than itself, as the training's threads wait for each other at every step; at nice 19 it runs mostly when a core
would idle. Two more bare runs, three times as long, one before the rounds and one after (the cost varies from run to
run), measure both, with a busy loop of known share switched on at each priority and off in turn every 50 steps,
and the per-step part is each share times the median of their cycles' factors. From the fixed and per-step parts,
the extra time is projected for runs of 3 and 5 minutes, and the run length where it falls under 3%. Then the
fully cached re-run is timed, both ways. Figures are printed, never asserted.

The fixed part is printed whole and in two: up to the first logged step (the command, Prefect's server and the
launcher start beside the training's imports) and after the loop (where the flow also evaluates the tuned model
on the validation split, plots and writes the model card, which the bare entry point does not). The runs cache
bytecode as Python does on a user's machine, even where PYTHONDONTWRITEBYTECODE is set (it is on this one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import yaml

from tuneline.pipeline.follow_log import TrainerLogReader
from tuneline.pipeline.give_way import WATCHER_NICE

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


class Run(NamedTuple):
    wall: float  # the command, start to exit
    first_step: float  # when trainer_log.jsonl got its first entry
    loop: float  # the steady loop (`steady_loop`)

    @property
    def after_loop(self) -> float:
        return self.wall - self.first_step - self.loop


def timed(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def loop_ended(entry: dict) -> bool:
    """A trainer_log.jsonl entry from the loop's end: its last step, or the Trainer's summary (the one entry with
    `train_loss`; every step's entry carries a `train_runtime` so far)."""
    return "train_loss" in entry or (entry.get("percentage") or 0) >= 100


def timed_watching(cmd: list[str], env: dict, output_dir: Path,
                   also: list[int]) -> tuple[float, float, dict[int, float]]:
    """Wall time of cmd, when its first training step was logged, and the share of this machine's CPU, by nice
    value, that every process but the training
    child (the command's own, its temporary server, the pids in `also`) and the child's background threads (those
    that used under a fifth of a core, where training's own use whole ones) used while the child's training loop
    ran: from its first trainer_log.jsonl entry to the loop's end (what comes after, such as the plot step's
    imports while the child evaluates its model, is part of the fixed cost)."""
    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first_step = _first_entry_time(output_dir / "trainer_log.jsonl", proc, start)
    log = TrainerLogReader(output_dir / "trainer_log.jsonl")
    samples, ended = [], False  # (time, training?, {(pid, thread): (cpu seconds, nice)}, {child's thread: ...})
    while proc.poll() is None:
        others, threads, training = {}, {}, False
        with contextlib.suppress(psutil.Error):
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            tree += [p for pid in also for p in (psutil.Process(pid), *psutil.Process(pid).children(True))]
            for process in tree:
                with contextlib.suppress(psutil.Error):
                    line = " ".join(process.cmdline())
                    if "-m tuneline.train" in line and "accelerate" not in line:
                        ended = ended or any(loop_ended(entry) for entry in log.new_entries())
                        training = log.offset > 0 and not ended
                        threads = _thread_times(process)
                    else:
                        others.update(_thread_times(process))
        samples.append((time.perf_counter(), training, others, threads))
        time.sleep(0.5)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    during = [s for s in samples if s[1]]
    if len(during) < 3:
        return wall, first_step(), {0: float("nan")}
    (t0, _, first, first_threads), (t1, _, last, last_threads) = during[0], during[-1]
    used: dict[int, float] = {}
    for thread, (cpu, nice) in last.items():
        used[nice] = used.get(nice, 0.0) + cpu - first.get(thread, (0.0, nice))[0]
    for thread, (cpu, nice) in last_threads.items():
        thread_use = cpu - first_threads.get(thread, (0.0, nice))[0]
        if thread_use / (t1 - t0) < 0.2:
            used[nice] = used.get(nice, 0.0) + thread_use
    return wall, first_step(), {nice: cpu / ((t1 - t0) * (os.cpu_count() or 1)) for nice, cpu in used.items()}


def _first_entry_time(path: Path, proc: subprocess.Popen, start: float) -> Callable[[], float]:
    """A function that returns when `path` first had an entry, in seconds from `start`, once `proc` has ended.

    Looked at every 20 ms in a thread of its own: a size check, so it can be frequent without taking CPU from
    the start-up it times, as sampling the process tree would.
    """
    seen = [float("nan")]

    def watch() -> None:
        while proc.poll() is None:
            with contextlib.suppress(OSError):
                if path.stat().st_size:
                    seen[0] = time.perf_counter() - start
                    return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()

    def seconds() -> float:
        thread.join()
        return seen[0]

    return seconds


def _thread_times(process) -> dict[tuple[int, int], tuple[float, int]]:
    """{(pid, thread id): (cpu seconds, nice value)} for each thread of a psutil process (Linux keeps a nice value
    per thread)."""
    times = {}
    for thread in process.threads():
        times[process.pid, thread.id] = (thread.user_time + thread.system_time, _thread_nice(thread.id))
    return times


def _thread_nice(tid: int) -> int:
    try:
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:  # it ended meanwhile
        return 0


def loop_cost_of_cpu_share(cmd: list[str], env: dict, output_dir: Path,
                           share: float = 0.05) -> dict[int, list[float]]:
    """How much a load taking `share` of this machine's CPU slows the training loop, as a multiple of `share`, for
    a load at the training's priority (nice 0) and one at the flow's watchers' (WATCHER_NICE): one estimate per
    cycle of phases.

    The training's threads wait for each other at every step, so CPU taken from one of them can cost the loop
    more than its share of the machine (1.2-3.0x on 2 cores, depending on the day); a load at nice 19 runs mostly
    when a core would idle. Measured on a bare run with a busy loop of known share here, in a thread at each priority in
    turn, switched on and off every 50 steps (off, nice 0, nice 19, ...): in each cycle, the median step time with a
    load over that of the unloaded phases before and after it (weighted by distance, so that this machine's drift
    cancels), less one, divided by the share the load got. A phase's first logging interval is left out: the switch
    is seen from trainer_log.jsonl, a little late.
    """
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log, step, tick = TrainerLogReader(output_dir / "trainer_log.jsonl"), 0, 0.25  # four bursts a second
    busy = {0: 0.0, WATCHER_NICE: 0.0}
    loaded = dict.fromkeys(busy, 0.0)
    phases, reading = [None, 0, WATCHER_NICE], threading.Lock()  # both load threads read the log

    def phase() -> int | None:
        nonlocal step
        with reading:
            step = max([step, *(entry.get("current_steps", 0) for entry in log.new_entries())])
            return phases[(step // 50) % len(phases)]

    def load(nice: int) -> None:  # as a server's pollers wake: a burst each tick while its phase lasts
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)  # this thread's own (Linux)
        while proc.poll() is None:
            began = time.perf_counter()
            if phase() == nice:
                cpu = time.thread_time()
                while time.thread_time() - cpu < share * (os.cpu_count() or 1) * tick and phase() == nice:
                    pass
                busy[nice] += time.thread_time() - cpu
                loaded[nice] += tick
            time.sleep(max(0.0, tick - (time.perf_counter() - began)))

    workers = [threading.Thread(target=load, args=(nice,), daemon=True) for nice in busy]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if proc.wait():
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    entries = [e for e in map(json.loads, (output_dir / "trainer_log.jsonl").read_text().splitlines()) if "loss" in e]
    by_phase: dict[int, list[float]] = {}  # phase number -> its step times
    for before, after in zip(entries, entries[1:], strict=False):
        first, last = before["current_steps"], after["current_steps"] - 1
        if first // 50 == last // 50 and first % 50 >= 10:  # within one phase, after its switch-over
            per_step = (after["elapsed_time"] - before["elapsed_time"]) / (last + 1 - first)
            by_phase.setdefault(first // 50, []).append(per_step)
    factors: dict[int, list[float]] = {}
    for nice in busy:
        measured_share = busy[nice] / max(loaded[nice], 1e-9) / (os.cpu_count() or 1)
        offset, cycle_len = phases.index(nice), len(phases)
        factors[nice] = []
        for cycle in range(0, max(by_phase, default=0) + 1, cycle_len):
            if not (by_phase.get(cycle) and by_phase.get(cycle + offset)):
                continue
            unloaded = statistics.median(by_phase[cycle])
            if by_phase.get(cycle + cycle_len):  # the unloaded phases on both sides, weighted by distance
                after = statistics.median(by_phase[cycle + cycle_len])
                unloaded = (unloaded * (cycle_len - offset) + after * offset) / cycle_len
            factors[nice].append((statistics.median(by_phase[cycle + offset]) / unloaded - 1) / measured_share)
        print(f"a busy loop at nice {nice} taking {100 * measured_share:.1f}% of this machine's CPU made training "
              f"steps {100 * measured_share * statistics.median(factors[nice]):+.1f}% slower than the unloaded "
              f"phases beside it (median of {len(factors[nice])} cycles): {statistics.median(factors[nice]):.2f}x "
              "its share", flush=True)
    return factors


def steady_loop(output_dir: Path) -> float:
    """The training loop from its first logged step on (the Trainer's train_runtime less that step's time).

    The first steps count as start-up: start-up work that overlaps them (such as the child's metrics sender
    importing MLflow, when the child sent its own metrics: 10 steps took 1.5-2.3 s in flow runs, 0.3 s in bare
    ones) is fixed cost, which the Trainer's train_runtime would count as loop time.
    """
    first = json.loads((output_dir / "trainer_log.jsonl").read_text().splitlines()[0])
    return float(json.loads((output_dir / "all_results.json").read_text())["train_runtime"]) - first["elapsed_time"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1500, help="training steps per run (1500: ~1-1.5 min here)")
    parser.add_argument("--pairs", type=int, default=3, help="rounds of bare / flow / flow-on-a-server runs")
    parser.add_argument("--no-server", action="store_true", help="skip the runs against `prefect server start`")
    args = parser.parse_args()
    if args.steps < 100:  # the calibration runs 3 x steps in phases of 50: at least two cycles of three
        parser.error(f"--steps {args.steps}: use 100 or more (1500 for the figures the README quotes)")
    root = Path(tempfile.mkdtemp(prefix="tuneline-bench-"))
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_HOME": str(root / "prefect")}
    env.pop("PREFECT_API_URL", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as on a user's machine, Python caches what it compiled once
    model = root / "tiny"
    subprocess.run([BIN / "tuneline", "tiny-model", str(model), "--preset", "demo"], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    config = yaml.safe_load((REPO / "examples" / "sft_lora_demo.yaml").read_text())
    config.update(model_name_or_path=str(model), max_steps=args.steps, pipeline_cache_dir=str(root / "cache"),
                  mlflow_tracking_uri=f"sqlite:///{root / 'mlflow.db'}", mlflow_registered_model=None)

    def write(name: str, **changes) -> Path:
        path = root / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**config, "output_dir": str(root / name), **changes}))
        return path

    # creates the stores, tokenizes, scores the base model: what every later run finds done
    t_first = timed([str(BIN / "tuneline"), "train", str(write("first", max_steps=1, learning_rate=1e-5))], env)
    kinds = {"bare": env, "flow": env}
    with _prefect_server(env, enabled=not args.no_server) as (server_env, server_pid):
        if server_env:
            kinds["server"] = server_env
        runs: dict[str, list[Run]] = {kind: [] for kind in kinds}
        taken: dict[str, list[dict[int, float]]] = {kind: [] for kind in kinds}
        calibrate = [str(BIN / "python"), "-m", "tuneline.train"]
        factors = loop_cost_of_cpu_share([*calibrate, str(write("calibrate-0", max_steps=3 * args.steps))], env,
                                        root / "calibrate-0")
        for n in range(args.pairs):
            order = list(kinds)[n % len(kinds):] + list(kinds)[:n % len(kinds)]  # each kind first in turn
            for kind in order:
                kind_env = kinds[kind]
                path = write(f"{kind}-{n}")
                cmd = ([str(BIN / "python"), "-m", "tuneline.train", str(path)] if kind == "bare"
                       else [str(BIN / "tuneline"), "train", str(path)])
                also = [server_pid] if server_pid else []  # it idles through every run: bare runs pay it too
                wall, first_step, share = timed_watching(cmd, kind_env, root / f"{kind}-{n}", also)
                runs[kind].append(Run(wall, first_step, steady_loop(root / f"{kind}-{n}")))
                taken[kind].append(share)
                print(f"round {n + 1} {kind:6s} wall {wall:6.1f} s   first logged step at {first_step:4.1f} s   "
                      f"steady loop {runs[kind][-1].loop:6.1f} s   other processes' CPU while training "
                      f"{_by_nice(share)}", flush=True)
        # a second calibration, after the rounds: the factors vary from one run to the next
        later = loop_cost_of_cpu_share([*calibrate, str(write("calibrate-1", max_steps=3 * args.steps))], env,
                                      root / "calibrate-1")
        factors = {nice: statistics.median(factors[nice] + later[nice]) for nice in factors}
        cached_path = root / "flow-0.yaml"
        cached = {kind: [timed([str(BIN / "tuneline"), "train", str(cached_path)], kinds[kind]) for _ in range(3)]
                  for kind in kinds if kind != "bare"}

    print(f"\nfirst run on fresh stores (1 step): {t_first:.1f} s   (paid once)")
    bare = runs["bare"]
    print(f"bare entry point, {args.steps} steps: wall median {statistics.median(r.wall for r in bare):.1f} s, "
          f"first logged step at {statistics.median(r.first_step for r in bare):.1f} s, steady loop median "
          f"{statistics.median(r.loop for r in bare):.1f} s")
    print(f"cost of a CPU share while training (median over both calibrations' cycles): "
          f"{', '.join(f'{factor:.2f}x at nice {nice}' for nice, factor in factors.items())}")
    for kind, label in (("flow", "flow, temporary server"), ("server", "flow, running server")):
        if kind in runs:
            report(label, runs[kind], bare, added_share(taken[kind], taken["bare"]), factors)
    for kind, times in cached.items():
        label = "temporary server" if kind == "flow" else "running server"
        print(f"fully cached re-run, {label}: median {statistics.median(times):.1f} s "
              f"({', '.join(f'{t:.1f}' for t in times)})")


def added_share(flow: list[dict[int, float]], bare: list[dict[int, float]]) -> dict[int, float]:
    """The median share of the CPU each nice value's threads took in flow runs, less that of bare runs."""
    nices = {nice for shares in flow + bare for nice in shares}
    return {nice: statistics.median(shares.get(nice, 0.0) for shares in flow)
            - statistics.median(shares.get(nice, 0.0) for shares in bare) for nice in nices}


def report(label: str, flow: list[Run], bare: list[Run], taken: dict[int, float], factors: dict[int, float]) -> None:
    """Paired medians of the extra wall time and of its fixed part (before the first logged step, and after the
    steady loop: the flow also evaluates the tuned model, plots and writes the card there); the per-step part from
    the CPU the flow's own processes took while training ran (steadier here than the loop times, which vary
    +-10% run to run), at each priority times what such a share was measured to cost the loop (`factors`: at
    least 1 at the training's priority, at least 0 below it)."""
    pairs = list(zip(flow, bare, strict=True))
    extra = statistics.median(f.wall - b.wall for f, b in pairs)
    share = statistics.median((f.wall - b.wall) / b.wall for f, b in pairs)
    fixed = statistics.median((f.wall - f.loop) - (b.wall - b.loop) for f, b in pairs)
    start = statistics.median(f.first_step - b.first_step for f, b in pairs)
    end = statistics.median(f.after_loop - b.after_loop for f, b in pairs)
    loop = statistics.median(f.loop / b.loop - 1 for f, b in pairs)
    print(f"{label}: extra {extra:+.1f} s ({100 * share:+.1f}%); outside the steady loop {fixed:+.1f} s (to the "
          f"first logged step {start:+.1f} s, after the loop {end:+.1f} s); loop time {100 * loop:+.1f}% (paired, "
          f"noisy); the flow's processes took {_by_nice(taken)} of the CPU while training ran")
    parts = []
    for nice, part in sorted(taken.items()):
        lowered = nice >= WATCHER_NICE
        factor = max(0.0 if lowered else 1.0, factors[WATCHER_NICE if lowered else 0])  # beyond: noise
        parts.append((max(0.0, part) * factor, f"{100 * part:.2f}% x {factor:.2f}"))
    per_step = sum(cost for cost, _ in parts)
    projected = ", ".join(f"{minutes} min: {100 * (fixed / (60 * minutes) + per_step):+.1f}%" for minutes in (3, 5))
    print(f"  per-step part {100 * per_step:.1f}% ({' + '.join(text for _, text in parts)}); projected extra "
          f"(fixed part + per-step part) for a bare run of {projected}; {_crossing(fixed, per_step)}")


def _by_nice(shares: dict[int, float]) -> str:
    return " and ".join(f"{100 * part:.2f}% at nice {nice}" for nice, part in sorted(shares.items()))


def _crossing(fixed: float, per_step: float) -> str:
    if per_step >= 0.03:
        return "never under 3% (the per-step part alone is more)"
    return f"under 3% from runs of {fixed / (0.03 - per_step) / 60:.1f} min"


@contextlib.contextmanager
def _prefect_server(env: dict, enabled: bool):
    """A running `prefect server start` (as in production): the environment that uses it, and its pid."""
    if not enabled:
        yield None, None
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"{api}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        yield {**env, "PREFECT_API_URL": api}, server.pid
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
