"""PiSSA: keep the adapter's initial state so the trained adapter can be saved as plain LoRA on the original base.

A trained PiSSA adapter only works on the residual weight; with `pissa_convert` the final save is rewritten as the
rank-2r LoRA [A | A0], [B | -B0] on the untouched W, which users load like any other adapter."""

from __future__ import annotations

import logging
from pathlib import Path

from tuneline.errors import UserError

logger = logging.getLogger("tuneline")

INIT_DIR_NAME = "pissa_init"


def pissa_init_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / INIT_DIR_NAME


def save_pissa_init(model, init_dir: str | Path) -> Path:
    """Save the untrained PiSSA adapter; marked init_lora_weights=True so loading it never re-decomposes W."""
    init_dir = Path(init_dir)
    peft_config = model.peft_config["default"]
    init = peft_config.init_lora_weights
    peft_config.init_lora_weights = True
    try:
        model.save_pretrained(str(init_dir))
    finally:
        peft_config.init_lora_weights = init
    logger.info("saved the initial PiSSA adapter to %s", init_dir)
    return init_dir


def convert_pissa_adapter(model, output_dir: str | Path, init_dir: str | Path) -> Path:
    """Save the trained PiSSA adapter in `output_dir` as plain LoRA; the model in memory stays PiSSA and trainable."""
    init_dir = Path(init_dir)
    if not (init_dir / "adapter_config.json").is_file():
        raise UserError(f"cannot convert the PiSSA adapter: its initial state '{init_dir}' is missing (it is saved "
                        "when training starts); train again from the start, or set 'pissa_convert: false'")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    model.save_pretrained(str(output_dir), path_initial_model_for_weight_conversion=str(init_dir))
    model.set_adapter("default")  # loading the initial adapter for the conversion may switch adapters
    for name, param in model.named_parameters():
        param.requires_grad_(name in trainable)
    logger.info("saved the PiSSA adapter converted to plain LoRA in %s", output_dir)
    return Path(output_dir)


def _callback_class():
    from transformers import TrainerCallback

    class PissaConvertCallback(TrainerCallback):
        """Saves the initial PiSSA adapter to <output_dir>/pissa_init when a run starts from step 0 (a resumed run
        finds it there)."""

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            init_dir = pissa_init_dir(args.output_dir)
            if (init_dir / "adapter_config.json").is_file() or not state.is_world_process_zero:
                return
            if state.global_step > 0:
                raise UserError(f"resumed a PiSSA run at step {state.global_step} but its initial adapter "
                                f"'{init_dir}' is missing; start again from step 0 or set 'pissa_convert: false'")
            save_pissa_init(_unwrap(model), init_dir)

    return PissaConvertCallback


def _unwrap(model):
    while hasattr(model, "module") and not hasattr(model, "peft_config"):
        model = model.module
    return model


def __getattr__(name: str):
    if name == "PissaConvertCallback":  # built on first use so importing this module needs no transformers
        cls = _callback_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
