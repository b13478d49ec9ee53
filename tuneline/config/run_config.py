"""The resolved config of one run: typed groups plus HF TrainingArguments keys."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneline.config.args import DataArgs, FinetuningArgs, GeneratingArgs, ModelArgs, PipelineArgs
from tuneline.config.grpo_keys import GrpoArgs
from tuneline.config.ray_keys import RaySettings
from tuneline.config.secrets import MASK, is_secret


@dataclass
class RunConfig:
    model: ModelArgs
    data: DataArgs
    finetuning: FinetuningArgs
    generating: GeneratingArgs
    pipeline: PipelineArgs
    training: dict[str, Any] = field(default_factory=dict)
    source: str | None = None
    grpo: GrpoArgs = field(default_factory=GrpoArgs)
    ray: RaySettings | None = None  # training on Ray: where its workers run, not what they train (not in flat())

    # --- views
    def flat(self) -> dict[str, Any]:
        """Every key in one flat mapping, as a user would write it in YAML."""
        out: dict[str, Any] = {}
        for group in (self.model, self.data, self.finetuning, self.generating, self.pipeline, self.grpo):
            out.update(dataclasses.asdict(group))
        out.update(self.training)
        return out

    def masked(self) -> dict[str, Any]:
        """`flat()` with secrets masked, for MLflow params and logs."""
        return {k: (MASK if v and is_secret(k) else v) for k, v in self.flat().items()}

    def without_secrets(self) -> RunConfig:
        """This config with every credential unset: what may be written to a file that MLflow logs."""
        groups = {name: dataclasses.replace(group, **{f.name: None for f in dataclasses.fields(group)
                                                      if is_secret(f.name) and getattr(group, f.name)})
                  for name, group in (("model", self.model), ("data", self.data), ("finetuning", self.finetuning),
                                      ("generating", self.generating), ("pipeline", self.pipeline),
                                      ("grpo", self.grpo))}
        return dataclasses.replace(self, **groups, training={k: v for k, v in self.training.items() if not is_secret(k)})

    def slice(self, *keys: str) -> dict[str, Any]:
        """The named keys only: the part of the config that matters to one step's fingerprint."""
        flat = self.flat()
        return {k: flat.get(k) for k in sorted(keys)}

    # --- derived names
    @property
    def stage(self) -> str:
        return self.finetuning.stage

    @property
    def output_dir(self) -> Path:
        return Path(self.training["output_dir"])

    @property
    def model_short_name(self) -> str:
        return Path(str(self.model.model_name_or_path).rstrip("/")).name

    @property
    def dataset_names(self) -> list[str]:
        return split_names(self.data.dataset)

    @property
    def eval_dataset_names(self) -> list[str]:
        return split_names(self.data.eval_dataset)

    @property
    def has_validation(self) -> bool:
        """Whether the data step will hold out a validation split, so that the run is evaluated."""
        return bool(self.eval_dataset_names) or bool(self.data.val_size)

    @property
    def predict_only(self) -> bool:
        """`do_predict` without `do_train` (LLaMA-Factory's nlg_eval): the flow answers the eval set, trains nothing."""
        return bool(self.training.get("do_predict")) and not self.training.get("do_train")

    @property
    def run_name(self) -> str:
        if self.pipeline.run_name:
            return self.pipeline.run_name
        if self.predict_only:
            return f"predict {self.model_short_name} {self.data.eval_dataset or self.data.dataset}"
        return f"{self.stage}-{self.finetuning.finetuning_type} {self.model_short_name} {self.data.dataset}"

    @property
    def experiment_name(self) -> str:
        return self.pipeline.mlflow_experiment or f"{self.stage}-{self.model_short_name}"

    # --- derived settings
    @property
    def effective_packing(self) -> bool:
        """LLaMA-Factory's default: pt packs (concatenated blocks), other stages do not; `neat_packing` packs."""
        packing = True if self.data.neat_packing else self.data.packing
        return self.stage == "pt" if packing is None else bool(packing) and self.stage in ("pt", "sft")


def split_names(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]
