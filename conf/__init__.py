"""Configuration: defaults in `defaults.toml`, loaded and typed by `settings.py`."""
from conf.settings import Settings, load_settings

__all__ = ["Settings", "load_settings"]
