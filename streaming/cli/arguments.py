"""A `delayq` subcommand's settings (command-line options over DELAYQ_* and conf/) and logging."""
from __future__ import annotations

import argparse
import sys

from conf.settings import ENV_PREFIX, load_settings


def env_name(name: str) -> str:
    return f"{ENV_PREFIX}{name.upper()}"


def setting_overrides(args: argparse.Namespace) -> dict[str, str]:
    keys = ("bootstrap_servers", "data_dir", "intake_topic")
    return {key: value for key in keys if (value := getattr(args, key, None)) is not None}


def settings_of(args: argparse.Namespace):
    return load_settings(**setting_overrides(args))


# What `delayq run` prints once its first batch is done (the benches wait for it).
STARTED = "delayq started in"
# The project's top-level packages: their loggers take the `log_level` setting.
PACKAGES = ("conf", "state", "sinks", "streaming")


def log_to_stderr(level: str) -> None:
    """delayq's loggers at `level`, other libraries' at WARNING, kafka-python's silent."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                           datefmt="%H:%M:%S"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    for package in PACKAGES:
        logging.getLogger(package).setLevel(level)
    # kafka-python's failures reach delayq as exceptions, which it reports in its own words;
    # its log has a line per connection (INFO), per event-loop task over 100 ms (WARNING, as a
    # busy 2-core host causes), and 4 a second while the broker is away (WARNING, ERROR).
    logging.getLogger("kafka").setLevel(logging.CRITICAL)


def add_common(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection and folders")
    group.add_argument("--bootstrap-servers",
                       help=f"Kafka bootstrap servers; empty = embedded local broker "
                            f"[{env_name('bootstrap_servers')}]")
    group.add_argument("--data-dir",
                       help=f"broker data, checkpoints and tables [{env_name('data_dir')}]")
    group.add_argument("--intake-topic", help=f"intake topic [{env_name('intake_topic')}]")
