"""Typed configuration: frozen dataclass schemas composed from sparrow/conf/ YAML with OmegaConf."""

from sparrow.config.load import ConfigError, load_config, to_yaml
from sparrow.config.schema import SparrowConfig

__all__ = ["ConfigError", "SparrowConfig", "load_config", "to_yaml"]
