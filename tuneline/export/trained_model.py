"""The model a training config produced, wherever it is now: what `tuneline export` merges and `tuneline chat`
talks to. Never the untouched base under the trained model's name."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from tuneline.config import RunConfig
from tuneline.config.run_config import split_names
from tuneline.errors import ConfigError, UserError

logger = logging.getLogger("tuneline")


def trained_model_config(config: RunConfig, scratch: Path | None,
                         model_folder: Path | None = None) -> tuple[RunConfig, str | None]:
    """The config that loads the model to export, and where the trained model came from (None for the config's own
    adapters). A trained model missing from `output_dir` is fetched from the MLflow run, so another machine still
    exports what was trained."""
    from tuneline.runtime.contract import finished_run

    if model_folder is not None:
        return _loading_trained(config, Path(model_folder)), str(model_folder)
    out = Path(config.training.get("output_dir") or ".")
    if finished_run(out):
        return _loading_trained(config, out), str(out)
    logged = _logged_model(config, scratch)
    if logged is not None:
        run_id, folder = logged
        return _loading_trained(config, folder), f"mlflow run {run_id}"
    if split_names(config.model.adapter_name_or_path):
        return config, None
    raise ConfigError(f"no trained model: 'output_dir' '{out}' holds no finished training, the MLflow store holds "
                      "no finished run of this config, and no 'adapter_name_or_path' is set; train with this config "
                      "first (`tuneline train`), or name the adapters to merge with 'adapter_name_or_path'")


def _loading_trained(config: RunConfig, folder: Path) -> RunConfig:
    from tuneline.evaluation.loading import ADAPTER_CONFIG, tuned_adapters

    if (folder / ADAPTER_CONFIG).is_file():  # the base, the adapters it was trained from, the trained one
        trained = dataclasses.replace(config.model, adapter_name_or_path=",".join(tuned_adapters(config, str(folder))))
    else:  # full or freeze tuning saved the whole model (which holds any adapters it was trained from)
        trained = dataclasses.replace(config.model, model_name_or_path=str(folder), adapter_name_or_path=None)
    return dataclasses.replace(config, model=trained)


def _logged_model(config: RunConfig, scratch: Path) -> tuple[str, Path] | None:
    """Only a training config (one that names its data) has a run to look for."""
    from tuneline.pipeline.record import logged_model

    if not config.data.dataset:
        return None
    try:
        return logged_model(config, scratch)
    except UserError as error:  # its data is gone too: the adapters the config names may still be merged
        logger.warning("not looking for this config's run in MLflow: %s", error)
        return None
