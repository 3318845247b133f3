"""`delayq`: the one entry point. Subcommands: run, demo, produce, offsets, kafka.

Every option can also be set from the environment as DELAYQ_<NAME> (named in --help);
the defaults shown come from conf/defaults.toml.
"""
from __future__ import annotations

import argparse
import json
import sys

from conf.settings import ENV_PREFIX, load_settings
from state.errors import DelayqError


def _env(name: str) -> str:
    return f"{ENV_PREFIX}{name.upper()}"


def _common(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection and folders")
    group.add_argument("--bootstrap-servers", help=f"Kafka bootstrap servers; empty = embedded local broker [{_env('bootstrap_servers')}]")
    group.add_argument("--data-dir", help=f"broker data, checkpoints and tables [{_env('data_dir')}]")
    group.add_argument("--intake-topic", help=f"intake topic [{_env('intake_topic')}]")


def _settings(args: argparse.Namespace):
    overrides = {
        key: value
        for key in ("bootstrap_servers", "data_dir", "intake_topic", "delay_levels")
        if (value := getattr(args, key, None)) is not None
    }
    return load_settings(**overrides)


def cmd_kafka(args: argparse.Namespace) -> int:
    from streaming import broker

    settings = _settings(args)
    spec = broker.spec_from_settings(settings)
    if args.action == "start":
        pid = broker.start(spec)
        print(f"kafka broker running: pid {pid}, bootstrap {spec.bootstrap}, data {spec.home}")
    elif args.action == "stop":
        stopped = broker.stop(spec)
        print("kafka broker stopped" if stopped else "kafka broker was not running")
    else:
        info = broker.status(spec)
        for key, value in info.items():
            print(f"{key:10} {value}")
        return 0 if info["answers"] else 3
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="delayq",
        description="Delay delivery for Kafka on Spark Structured Streaming.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    kafka = sub.add_parser("kafka", help="start, stop or inspect the embedded local Kafka broker")
    kafka.add_argument("action", choices=("start", "stop", "status"))
    _common(kafka)
    kafka.set_defaults(func=cmd_kafka)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except DelayqError as exc:
        print(f"delayq: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
