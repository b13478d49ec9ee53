"""Training entry point, what `accelerate launch` runs in every process:

    python -m tuneline.train CONFIG [--dataset PATH]

PATH is the processed dataset folder (or a JSON file holding the reference `build_dataset` returned); without
it the dataset is built (or found in the step cache) here. Process 0 locks output_dir, decides whether to resume
(see output_dir.py) and writes run.json; every process then trains from the same checkpoint. Environment (names
in tuneline.runtime.contract): TUNELINE_TRAIN_KEY (the train step's key; computed here when absent),
TUNELINE_RESUME_KEY (what a checkpoint can be resumed across, see output_dir.py),
MLFLOW_RUN_ID + MLFLOW_TRACKING_URI (log step metrics into that run), TUNELINE_DIE_WITH_PARENT=1 (exit when the
launching process dies). Exit code 2 with a one-line `tuneline: error:` message for anything the user can fix.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from tuneline.errors import UserError
from tuneline.runtime.contract import (
    ERROR_PREFIX,
    RESUME_KEY_ENV,
    TRAIN_KEY_ENV,
    die_with_parent_if_asked,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tuneline.train", description=__doc__.splitlines()[0])
    parser.add_argument("config", help="resolved run config (YAML)")
    parser.add_argument("--dataset", default=None, help="processed dataset folder, or a JSON dataset reference")
    return parser.parse_args(argv)


def dataset_reference(config, path: str | None) -> dict:
    if path is None:
        from tuneline.data import build_dataset

        return build_dataset(config)
    file = Path(path)
    if file.is_file() and file.suffix == ".json":
        return json.loads(file.read_text())
    if not file.exists():
        raise UserError(f"'--dataset' path '{path}' does not exist")
    return {"path": str(file)}


def prepare(config, dataset_ref: dict, is_main: bool, wait_for_everyone):
    """Process 0 locks output_dir and decides the resume point; the others read it from run.json."""
    from tuneline.identity.config_keys import standalone_key
    from tuneline.runtime.contract import read_run_file
    from tuneline.train.output_dir import prepare_output_dir

    lock = None
    if is_main:
        key = os.environ.get(TRAIN_KEY_ENV)
        # alone (no flow gave keys), the key computed here leaves out what does not shape the weights: it is both
        resume_key = os.environ.get(RESUME_KEY_ENV) if key else None
        key = key or standalone_key(config, dataset_ref)
        lock, resume = prepare_output_dir(config, key, os.environ.get("MLFLOW_RUN_ID"), resume_key or key)
        if resume is None:
            from tuneline.train.mlflow_checkpoints import restore_into_run_file

            try:
                restore_into_run_file(config)  # empty output_dir: fetch the run's last checkpoint from MLflow
            except BaseException:
                if lock is not None:
                    lock.release()
                raise
    wait_for_everyone()
    resumed = (read_run_file(config.output_dir) or {}).get("resumed_from")
    config.training["resume_from_checkpoint"] = resumed
    return lock


@contextmanager
def user_errors_end_the_process():
    """Anything the user can fix (a UserError, a full disk) ends this process with one `tuneline: error:` line,
    which the flow's side shows, and exit code 2; anything else is a bug and keeps its traceback."""
    try:
        yield
    except UserError as err:
        print(ERROR_PREFIX + str(err).replace("\n", "\n  "), file=sys.stderr, flush=True)
        raise SystemExit(err.exit_code) from None
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f" writing {err.filename}" if err.filename else ""
        print(f"{ERROR_PREFIX}no space left on the device{where} ({err.strerror}): free space and run the same "
              "command again; it resumes from the last complete checkpoint, which a failed save leaves intact",
              file=sys.stderr, flush=True)
        raise SystemExit(UserError.exit_code) from None


def main(argv: list[str] | None = None) -> int:
    """Every process: the same stage from the same checkpoint; process 0 alone marks run.json complete."""
    args = parse_args(argv)
    die_with_parent_if_asked()  # no orphan keeps training
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from accelerate import PartialState  # after die_with_parent: a parent lost during these imports ends this too

    from tuneline.config import load_config
    from tuneline.runtime.contract import COMPLETE, write_run_file
    from tuneline.runtime.deepspeed_setup import share_process_group
    from tuneline.train import stage_runner
    from tuneline.train.training_args import build_training_args

    with user_errors_end_the_process():
        config = load_config(args.config)
        train_stage = stage_runner(config.stage)
        _ = build_training_args(config).device  # sets up the process group this launch asked for
        share_process_group(config.training)  # DeepSpeed's comm on that group (accelerate does it on GPUs only)
        state = PartialState()
        dataset_ref = dataset_reference(config, args.dataset)
        lock = prepare(config, dataset_ref, state.is_main_process, state.wait_for_everyone)
        try:
            result = train_stage(config, dataset_ref, [])
            state.wait_for_everyone()
            if state.is_main_process:
                write_run_file(config.output_dir, status=COMPLETE, global_step=result.get("global_step"),
                               finished=time.strftime("%Y-%m-%dT%H:%M:%S"))
        finally:
            if lock is not None:
                lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
