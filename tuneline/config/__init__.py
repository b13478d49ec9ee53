"""Config: one flat YAML (LLaMA-Factory's keys plus tuneline's), parsed into typed groups."""

from tuneline.config.loader import dump_config, load_config, parse_overrides
from tuneline.config.run_config import RunConfig

__all__ = ["RunConfig", "dump_config", "load_config", "parse_overrides"]
