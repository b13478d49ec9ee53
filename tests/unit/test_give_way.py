"""Threads that only watch a training give way to it for the CPU (tuneline.pipeline.give_way), in a process of
its own: raising a priority again needs privilege, and pytest's threads must not stay lowered."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tuneline.pipeline.give_way import WATCHER_NICE

SCRIPT = """
import json, os, subprocess, sys, threading
from tuneline.pipeline.give_way import add_watcher, watchers_give_way

def nice(tid):
    return os.getpriority(os.PRIO_PROCESS, tid)

def threads(pid):
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))

stop = threading.Event()
helper = threading.Thread(target=stop.wait)
helper.start()
server = subprocess.Popen([sys.executable, "-c", "import threading, time; threading.Thread(target=time.sleep, "
                           "args=(60,), daemon=True).start(); time.sleep(60)"])
while len(threads(server.pid)) < 2:
    pass
add_watcher(server.pid)
training = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # as the calling thread starts it
me = threading.get_native_id()
with watchers_give_way() as lowered:
    late = threading.Thread(target=stop.wait)  # started by the calling thread, after: its own priority
    late.start()
    retry = subprocess.Popen([sys.executable, "-c", "import os; print(os.nice(0))"], stdout=subprocess.PIPE)
    inside = {"me": nice(me), "helper": nice(helper.native_id), "server": [nice(t) for t in threads(server.pid)],
              "late": nice(late.native_id), "training": nice(training.pid), "retry": int(retry.communicate()[0]),
              "lowered": sorted(tid for _, tid in lowered)}
after = {"helper": nice(helper.native_id), "server": [nice(t) for t in threads(server.pid)]}
try:  # may this process raise a priority again (root with CAP_SYS_NICE)?
    os.setpriority(os.PRIO_PROCESS, late.native_id, 1)
    os.setpriority(os.PRIO_PROCESS, late.native_id, 0)
    privileged = True
except PermissionError:
    privileged = False
stop.set()
for process in (server, training):
    process.kill()
print(json.dumps({"inside": inside, "after": after, "privileged": privileged, "helper": helper.native_id}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux keeps a nice value per thread")
def test_watching_threads_and_watcher_processes_give_way_while_the_training_keeps_its_priority():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    inside, after = seen["inside"], seen["after"]
    assert inside["helper"] == WATCHER_NICE and inside["server"] == [WATCHER_NICE] * 2, inside
    assert inside["me"] == inside["late"] == inside["training"] == 0, "the calling thread and what it starts keep theirs"
    assert inside["retry"] == 0, "a training the calling thread starts meanwhile (a retry) trains at its priority"
    assert seen["helper"] in inside["lowered"]
    restored = 0 if seen["privileged"] else WATCHER_NICE
    assert after["helper"] == restored and after["server"] == [restored, restored], seen


WATCHER_SCRIPT = """
import contextvars, json, os, signal, subprocess, sys, threading
from tuneline.pipeline.give_way import run_as_watcher

run = contextvars.ContextVar("run")
run.set("this run")
seen = run_as_watcher(lambda: (run.get(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())), print)
try:
    run_as_watcher(lambda: int("not a number"), print)
except ValueError as error:
    failed = str(error)
training = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    run_as_watcher(training.wait, interrupted=training.kill)
except KeyboardInterrupt:
    print(json.dumps({"seen": seen, "failed": failed, "killed": training.returncode,
                      "me": os.getpriority(os.PRIO_PROCESS, threading.get_native_id())}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux keeps a nice value per thread")
def test_the_work_that_follows_a_training_runs_as_a_watcher_in_this_context_and_ctrl_c_ends_it():
    done = subprocess.run([sys.executable, "-c", WATCHER_SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["seen"] == ["this run", WATCHER_NICE], "the orchestrator's context, at the watchers' priority"
    assert "not a number" in out["failed"], "the work's error reaches the caller"
    assert out["killed"] == -9 and out["me"] == 0, "Ctrl-C while waiting ends the training; the caller keeps its own"
