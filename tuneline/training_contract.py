"""What the flow's process and the training child agree on, so that neither side imports the other.

The parent (`tuneline.pipeline`) launches `python -m tuneline.train` (`tuneline.train`) and reads its output and its
files; these names and the kernel hook below are the whole of what they share.
"""

from __future__ import annotations

import signal
import sys

# The child prints a problem the user can fix as one line starting with this, and exits 2: the parent shows that
# line instead of a traceback, and does not retry (the same config fails the same way).
ERROR_PREFIX = "tuneline: error: "

TRAIN_KEY_ENV = "TUNELINE_TRAIN_KEY"  # the train step's key, so the child needs not compute it again
RESUME_KEY_ENV = "TUNELINE_RESUME_KEY"  # what a checkpoint's optimisation depends on: resumable across other changes
DIE_WITH_PARENT_ENV = "TUNELINE_DIE_WITH_PARENT"  # "1": the child dies with the process that launched it

LOG_FILE = "trainer_log.jsonl"  # in output_dir: one line per logged step, written by the child, read for progress
METRICS_SPOOL_DIR = "mlflow_spool"  # in output_dir: step metrics kept while MLflow is unreachable


def die_with_parent(signum: int = signal.SIGKILL) -> bool:
    """This process gets `signum` when its parent dies, even by SIGKILL (Linux only; False elsewhere).

    Called in a child (as preexec_fn, or first thing), so that no orphan keeps training and holding its lock.
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signum) == 0  # PR_SET_PDEATHSIG
    except OSError:
        return False
