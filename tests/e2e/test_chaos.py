"""The reduced fault suite of `make chaos` (benchmarks/chaos.py), in `make test`: a real `python -m flows.finetune`
process group is SIGKILLed after its second checkpoint, the last checkpoint's safetensors file is then cut in
half, and the same command is rerun. The damaged checkpoint is set aside with a warning naming the file (never
loaded), training resumes from the one before, no step finished before the kill is recomputed, the losses, eval
metrics and weights equal an uninterrupted run's, and the config has one MLflow run."""

from __future__ import annotations


def test_a_killed_run_with_a_truncated_checkpoint_resumes_from_the_one_before(chaos, tmp_path, tiny_model_dir):
    suite = chaos.Suite(tmp_path, tiny_model_dir)
    short = {"max_steps": 6, "save_steps": 2, "eval_dataset": None}  # the cheapest run that has two checkpoints
    outcome = suite.run_then_damage(
        "kill then truncated checkpoint", chaos.damage_last_checkpoint, "set aside, resumed from the one before",
        chaos.check_checkpoint_set_aside, stop_at=lambda root: len(chaos.checkpoints(root / "out")) >= 2, **short)
    assert outcome.passed, outcome.observed
    assert outcome.observed.startswith("truncated checkpoint-") and "adapter_model.safetensors" in outcome.observed
