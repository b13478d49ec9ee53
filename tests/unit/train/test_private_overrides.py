"""transformers' private Trainer methods tuneline still overrides, pinned: a transformers release that renames one or
changes its parameters fails here, before a training silently stops calling the override. The dependency bound
admits every transformers 5 release; this test is what tells us, in `make test-latest`, that a new one broke them.

Why each stays (no public hook does the same):
- `_save_checkpoint` and `_get_output_dir` (trainer_base.py): a checkpoint is written under `.partial/` and renamed
  into place once whole, so a kill mid-save never leaves a half checkpoint that a resume would load. The public
  `on_save` callback runs only after the checkpoint is written in place, and the folder it writes to is chosen
  inside `_save_checkpoint`.
- `_run_epoch` (trainer_base.py): a run resumed at its last step trains no step; transformers would run one more
  (checkpoint-N+1) when the last step falls mid-epoch: it skips the batches seen and trains the next one before it
  checks max_steps (measured with transformers 5.24: without the override,
  tests/integration/train/test_checkpoints.py::test_resume_from_the_last_step_trains_no_extra_step ends at step 5
  of 4). Not calling train() instead would need the checkpoint's weights, optimizer-free, loaded into the
  model (a PEFT adapter, a value head, a DeepSpeed engine): train(resume_from_checkpoint) is transformers' only
  public loader of them all.
Pairs count the tokens of both answers through the public `training_step` and `log` (trainer_base.py), no longer
through `_track_num_input_tokens`.
"""

from __future__ import annotations

import inspect

import pytest
from transformers import Trainer

PINNED = {
    "_save_checkpoint": ["self", "model", "trial"],
    "_get_output_dir": ["self", "trial"],
    "_run_epoch": ["self", "model", "epoch", "train_dataloader", "steps_in_epoch", "num_update_steps_per_epoch",
                   "trial", "ignore_keys_for_eval", "start_time", "resume_from_checkpoint", "epochs_trained",
                   "steps_trained_in_current_epoch"],
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_the_private_methods_tuneline_overrides_are_as_it_expects(name):
    assert hasattr(Trainer, name), f"transformers' Trainer has no {name} any more: tuneline's override is dead code"
    assert list(inspect.signature(getattr(Trainer, name)).parameters) == PINNED[name]


def test_every_private_override_in_the_trainers_is_pinned():
    from tuneline.train.dpo import DPOTrainer, PreferenceTrainer
    from tuneline.train.kto import KTOTrainer
    from tuneline.train.rm import PairwiseTrainer
    from tuneline.train.sft import SFTTrainer
    from tuneline.train.trainer_base import TunelineTrainer

    trainers = (TunelineTrainer, PreferenceTrainer, DPOTrainer, KTOTrainer, PairwiseTrainer, SFTTrainer)
    overridden = {name for cls in trainers for name in vars(cls)
                  if name.startswith("_") and not name.startswith("__") and hasattr(Trainer, name)}
    assert overridden == set(PINNED)
