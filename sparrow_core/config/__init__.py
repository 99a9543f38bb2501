"""Typed configuration: frozen dataclass schemas composed from conf/ YAML with OmegaConf."""

from sparrow_core.config.load import ConfigError, load_config, to_yaml
from sparrow_core.config.schema import SparrowConfig

__all__ = ["ConfigError", "SparrowConfig", "load_config", "to_yaml"]
