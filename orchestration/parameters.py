"""The flow's typed parameters: the keys users change most, as real fields of the Prefect UI's Run form.

The config file holds everything; these fields, when set, override it, and `overrides` (key=value, typed as in
YAML) reaches any other key. Values are checked by the config itself, as from the command line.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Settings(BaseModel):
    """Set a field to override the config's value; leave it empty to keep it."""

    model_config = ConfigDict(extra="forbid")

    model_name_or_path: str | None = Field(None, description="Base model: a hub id or a local folder.")
    dataset: str | None = Field(None, description="Training data: names in dataset_info.json, comma-separated.")
    stage: Literal["pt", "sft", "rm", "dpo", "kto", "ppo", "grpo", "rloo"] | None = Field(None, description="Training stage.")
    finetuning_type: Literal["lora", "oft", "freeze", "full"] | None = Field(None, description="What is trained.")
    learning_rate: float | None = Field(None, gt=0, description="Peak learning rate.")
    num_train_epochs: float | None = Field(None, gt=0, description="Epochs (unless max_steps is set).")
    max_steps: int | None = Field(None, description="Optimizer steps; overrides num_train_epochs when > 0.")
    lora_rank: int | None = Field(None, ge=1, description="LoRA rank.")
    pref_beta: float | None = Field(None, gt=0, description="Preference strength (dpo, kto).")

    def as_overrides(self) -> list[str]:
        return [f"{key}={json.dumps(value)}" for key, value in self.model_dump(exclude_none=True).items()]


def all_overrides(settings: Settings | None, overrides: list[str] | None) -> list[str]:
    """The fields that are set, then the free overrides (which win on the same key)."""
    return [*(settings.as_overrides() if settings else []), *(overrides or [])]
