"""The settings a `delayq` subcommand runs with: conf/ defaults and DELAYQ_* environment,
overridden by the connection and folder options given on its command line."""
from __future__ import annotations

import argparse

from conf.settings import ENV_PREFIX, load_settings


def env_name(name: str) -> str:
    return f"{ENV_PREFIX}{name.upper()}"


def setting_overrides(args: argparse.Namespace) -> dict[str, str]:
    return {
        key: value
        for key in ("bootstrap_servers", "data_dir", "intake_topic", "delay_levels")
        if (value := getattr(args, key, None)) is not None
    }


def settings_of(args: argparse.Namespace):
    return load_settings(**setting_overrides(args))
