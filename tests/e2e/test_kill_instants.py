"""Kill instants of `make chaos` over the life of a run, sized for `make test`: a real `python -m flows.finetune`
process group is SIGKILLed at the instant named, then the same command is rerun. Each rerun exits 0 without a
traceback, recomputes no step finished before the kill, ends with the weights, per-step losses and metrics of an
uninterrupted run, and the config has one MLflow run.

Instants too short to catch from outside are held open by benchmarks/chaos.py's test-only hooks (a
sitecustomize on the killed run's PYTHONPATH that only waits: nothing else changes)."""

from __future__ import annotations

import pytest

SHORT = {"max_steps": 6, "save_steps": 2, "eval_dataset": None}  # the cheapest run with checkpoints


@pytest.fixture(scope="module")
def suite(chaos, tmp_path_factory, tiny_model_dir):
    return chaos.Suite(tmp_path_factory.mktemp("kills"), tiny_model_dir)  # one uninterrupted baseline for all


def test_killed_after_the_training_finished_before_the_flow_recorded_it(chaos, suite):
    outcome = suite.kill_and_rerun("kill between the child's end and the flow's record", chaos.training_finished,
                                   chaos.linger_at_exit_env, **SHORT)
    assert outcome.passed, outcome.observed


def test_killed_while_mlflow_creates_its_store_on_the_first_run(chaos, suite):
    outcome = suite.kill_and_rerun("kill while MLflow creates its store", chaos.migrating_store,
                                   chaos.pause_store_migration_env, **SHORT)
    assert outcome.passed, outcome.observed
