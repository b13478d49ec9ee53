"""Training entry point, what `accelerate launch` runs in every process:

    python -m tuneline.train CONFIG [--dataset PATH] [--evaluate DATASET_REF]
    python -m tuneline.train --wait-for-start FILE --stage STAGE   (imports, then takes the rest from FILE)

PATH is the processed dataset folder (or a JSON file holding the reference `build_dataset` returned); without
it the dataset is built (or found in the step cache) here. With --evaluate, a one-process run then does the
flow's evaluate step for the trained model (see evaluate_trained); --wait-for-start is an early launch (see
early_launch.py). Process 0 locks output_dir, decides whether to resume (see output_dir.py) and writes
run.json; every process then trains from the same checkpoint. Environment:
TUNELINE_TRAIN_KEY (the train step's key; computed here when absent), MLFLOW_RUN_ID + MLFLOW_TRACKING_URI (stream
metrics into that run), TUNELINE_DIE_WITH_PARENT=1 (exit when the launching process dies). Exit code 2 with a
one-line `tuneline: error:` message for anything the user can fix.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from tuneline.errors import UserError

ERROR_PREFIX = "tuneline: error: "


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tuneline.train", description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", help="resolved run config (YAML)")
    parser.add_argument("--dataset", default=None, help="processed dataset folder, or a JSON dataset reference")
    parser.add_argument("--evaluate", metavar="DATASET_REF", default=None,
                        help="then run the evaluate step for the trained model on this build-dataset result (JSON)")
    parser.add_argument("--wait-for-start", metavar="FILE", default=None,
                        help="import first, then wait for FILE to give the arguments (see early_launch.py)")
    parser.add_argument("--stage", default="sft", help="with --wait-for-start: the stage whose modules to import")
    args = parser.parse_args(argv)
    if not args.config and not args.wait_for_start:
        parser.error("a config is required (or --wait-for-start FILE)")
    return args


def die_with_parent() -> None:
    """Linux: have the kernel kill this process if its parent dies, so no orphan keeps training (and the lock)."""
    from tuneline.train.launch import die_with_parent as arm

    if os.environ.get("TUNELINE_DIE_WITH_PARENT") == "1" and arm() and os.getppid() == 1:
        os._exit(1)  # the parent died before prctl took effect


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
    from tuneline.train.output_dir import prepare_output_dir, read_run_file, train_key

    lock = None
    if is_main:
        key = os.environ.get("TUNELINE_TRAIN_KEY") or train_key(config, dataset_ref)
        lock, resume = prepare_output_dir(config, key, os.environ.get("MLFLOW_RUN_ID"))
        if resume is None:
            from tuneline.train.mlflow_checkpoints import restore_into_run_file

            try:
                restore_into_run_file(config)  # empty output_dir: fetch the run's last checkpoint from MLflow
            except BaseException:
                lock.release()
                raise
    wait_for_everyone()
    resumed = (read_run_file(config.output_dir) or {}).get("resumed_from")
    config.training["resume_from_checkpoint"] = resumed
    return lock


def train(config_path: str, dataset_path: str | None, evaluate_on: str | None = None) -> dict:
    from accelerate import PartialState

    from tuneline.config import load_config
    from tuneline.train import stage_runner
    from tuneline.train.output_dir import write_run_file
    from tuneline.train.training_args import build_training_args

    config = load_config(config_path)
    run = stage_runner(config.stage)
    _ = build_training_args(config).device  # sets up the process group this launch asked for
    state = PartialState()
    dataset_ref = dataset_reference(config, dataset_path)
    lock = prepare(config, dataset_ref, state.is_main_process, state.wait_for_everyone)
    try:
        result = run(config, dataset_ref, [])
        state.wait_for_everyone()
        if state.is_main_process:
            write_run_file(config.output_dir, status="complete", global_step=result.get("global_step"),
                           finished=time.strftime("%Y-%m-%dT%H:%M:%S"))
        if evaluate_on and state.num_processes == 1:
            evaluate_trained(config, evaluate_on)
        return result
    finally:
        if lock is not None:
            lock.release()


def evaluate_trained(config, dataset_ref_file: str) -> None:
    """The flow's `evaluate` step for the model just trained, run here, where its libraries are loaded already.

    The result goes to the step cache under the step's own key (train key, data, eval config), where the step
    finds it: the flow's process then imports no torch, transformers or peft (~5 s of CPU that competed with
    training). One process only (not DeepSpeed); whatever fails here is left to the step, which reports it.
    """
    key = os.environ.get("TUNELINE_TRAIN_KEY")
    if not key or config.training.get("deepspeed"):
        return
    import gc

    import torch

    from tuneline.evaluation import evaluate_model

    gc.collect()  # the trainer is done with: never two models in memory at once
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    log = logging.getLogger("tuneline")
    try:
        done = evaluate_model(config, json.loads(Path(dataset_ref_file).read_text()), str(config.output_dir), key)
    except Exception as err:  # noqa: BLE001 - the evaluate step runs it again and reports the error
        log.info("the trained model is left to the evaluate step: %s", err)
        return
    log.info("evaluated the trained model for the evaluate step: %s",
             ", ".join(f"{name} {value:.4g}" for name, value in sorted(done["metrics"].items())))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.wait_for_start:
            from tuneline.train.early_launch import wait_for_start

            args = parse_args(wait_for_start(args.wait_for_start, args.stage))
        train(args.config, args.dataset, args.evaluate)
    except UserError as err:
        print(ERROR_PREFIX + str(err).replace("\n", "\n  "), file=sys.stderr, flush=True)
        return err.exit_code
    return 0


if __name__ == "__main__":
    from tuneline.quick_exit import exit_quickly

    exit_quickly(main())  # torch's and MLflow's teardown took 1.2-1.9 s after every training
