"""`delayq`: the one entry point, its parser and the job commands (run, submit); every option
can also be set from the environment as DELAYQ_<NAME>."""
from __future__ import annotations

import argparse
import os
import sys

from state.errors import DelayqError
from streaming.cli.arguments import STARTED, add_common, env_name, log_to_stderr, \
    setting_overrides, settings_of
from streaming.cli.commands import cmd_cancel, cmd_ledger, cmd_offsets, cmd_produce, cmd_status, \
    cmd_tables
from streaming.tools.tool_commands import add_tool_parsers


def cmd_run(args: argparse.Namespace) -> int:
    import threading

    from streaming.runner import running_job, stop_on_signals, wait
    from streaming.tools.broker import embedded

    stop = threading.Event()
    stop_on_signals(stop, starting=True)
    settings = settings_of(args)
    log_to_stderr(settings.log_level)
    with embedded(settings), running_job(
            settings, allow_fresh_checkpoint=args.allow_fresh_checkpoint,
            allow_config_change=args.allow_config_change) as job:
        print(f"delayq running: intake {settings.intake_topic} on {settings.bootstrap}, "
              f"delivery {settings.delivery}, checkpoint {job.checkpoint}, "
              f"metrics http://{settings.metrics_host}:{settings.metrics_port}/metrics, "
              f"Spark UI {job.spark.sparkContext.uiWebUrl or 'off'}. Ctrl-C stops.",
              flush=True)
        steps = ", ".join(f"{k} {v} s" for k, v in job.startup_s.items())
        first = ", ".join(f"{k} {v} s" for k, v in job.first_batch_s.items())
        print(f"{STARTED} {sum(job.startup_s.values()):.1f} s ({steps}; first batch: "
              f"{first})", flush=True)
        wait(job, stop)
    print("delayq stopped; pending messages stay in the checkpoint until the next run")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from streaming.tools import cluster
    from streaming.spark.submit import submit, submit_command

    settings = settings_of(args)
    master = args.master or cluster.spec_from_settings(settings).master_url
    run_args = [flag for flag, on in (("--allow-fresh-checkpoint", args.allow_fresh_checkpoint),
                                      ("--allow-config-change", args.allow_config_change)) if on]
    options = dict(deploy_mode=args.deploy_mode, total_cores=args.total_executor_cores,
                   run_args=run_args)
    if args.dry_run:
        print(" ".join(submit_command(settings, master, **options)))
        return 0
    # The driver spark-submit starts reads its settings from the environment.
    os.environ.update({env_name(k): str(v) for k, v in setting_overrides(args).items()})
    if not master.startswith("local"):
        unset = [k for k in ("spark_shuffle_partitions", "ready_partitions")
                 if env_name(k) not in os.environ]
        os.environ.update({env_name(k): "0" for k in unset})
        if unset:
            print(f"delayq submit: {' and '.join(unset)} sized for the task slots the job gets "
                  f"(at a new checkpoint's first start; set {env_name(unset[0])} to choose)",
                  flush=True)
    return submit(settings, master, **options)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="delayq", description="Delay delivery for Kafka on Spark Structured Streaming.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    # The order here is the order `delayq --help` lists them in.
    _add_job_parsers(sub)
    _add_message_parsers(sub)
    _add_inspect_parsers(sub)
    add_tool_parsers(sub)
    return parser


def _add_job_parsers(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser(
        "run", help="run the delivery job (embedded broker unless Kafka is configured)")
    add_common(run)
    run.add_argument("--allow-fresh-checkpoint", action="store_true",
                     help="start a new checkpoint although the consumer group shows an earlier "
                          "run (replays the intake; pending messages of that run are lost)")
    run.add_argument("--allow-config-change", action="store_true",
                     help="start on a checkpoint written with other level, slot or partition "
                          "settings")
    run.set_defaults(func=cmd_run)

    submit = sub.add_parser("submit", help="run the delivery job through spark-submit on a master")
    add_common(submit)
    submit.add_argument("--master", help="spark://host:port, k8s://https://host:port or local[N] "
                                         "[default: the local cluster of `delayq cluster start`]")
    submit.add_argument("--deploy-mode", choices=("client", "cluster"), default="client",
                        help="where the driver runs (standalone clusters run Python drivers in "
                             "client mode)")
    submit.add_argument("--total-executor-cores", type=int,
                        help="cores the job takes from the cluster")
    submit.add_argument("--dry-run", action="store_true",
                        help="print the spark-submit command only")
    for flag in ("--allow-fresh-checkpoint", "--allow-config-change"):
        submit.add_argument(flag, action="store_true",
                            help="passed to `delayq run` (see run --help)")
    submit.set_defaults(func=cmd_submit)


def _add_message_parsers(sub: argparse._SubParsersAction) -> None:
    produce = sub.add_parser("produce", help="send one delayed message",
                             formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    produce.add_argument("--topic", required=True, help="the real topic (REAL_TOPIC)")
    produce.add_argument("--level", type=int, default=0, help="delay level (0: at once)")
    produce.add_argument("--key", help="message key")
    produce.add_argument("--partition", type=int, help="real partition (REAL_QID)")
    produce.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                         help="user header, repeatable")
    timer = produce.add_mutually_exclusive_group()
    timer.add_argument("--deliver-at-ms", type=int, help="absolute deliver time, epoch ms")
    timer.add_argument("--delay-ms", type=int,
                       help="deliver this long after the broker's append time")
    produce.add_argument("value", help="message value (UTF-8)")
    add_common(produce)
    produce.set_defaults(func=cmd_produce)

    cancel = sub.add_parser("cancel",
                            help="cancel a pending message by the handle `produce` printed")
    cancel.add_argument("handle", help="UNIQ_KEY@DUE_MS@LEVEL")
    add_common(cancel)
    cancel.set_defaults(func=cmd_cancel)


def _add_inspect_parsers(sub: argparse._SubParsersAction) -> None:
    offsets = sub.add_parser("offsets",
                             help="print the delayOffset table of the last committed batch")
    offsets.add_argument("--checkpoint",
                         help="checkpoint folder [default: <data_dir>/checkpoints/delivery]")
    add_common(offsets)
    offsets.set_defaults(func=cmd_offsets)

    ledger = sub.add_parser(
        "ledger", help="where is a message: delivered, pending or dead-lettered; or --summary",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ledger.add_argument("uniq_key", nargs="?", help="the message's UNIQ_KEY")
    ledger.add_argument("--summary", action="store_true", help="counts and lateness per level")
    ledger.add_argument("--since", help="with --summary: from this ISO time (UTC if no zone)")
    ledger.add_argument("--until", help="with --summary: before this ISO time")
    ledger.add_argument("--checkpoint", help="checkpoint folder for pending lookups")
    add_common(ledger)
    ledger.set_defaults(func=cmd_ledger)

    tables = sub.add_parser("tables", help="maintain the ledger and dead-letter tables",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    tables.add_argument("action", choices=("maintain",))
    tables.add_argument("--retain-days", type=int, default=None,
                        help="delete rows older than this many days (default: keep all)")
    tables.add_argument("--vacuum-hours", type=int, default=168,
                        help="VACUUM files no longer in the table for this long")
    add_common(tables)
    tables.set_defaults(func=cmd_tables)

    status = sub.add_parser("status", help="headline figures from the running job's exporter")
    status.add_argument("--url",
                        help="exporter URL [default: http://<metrics_host>:<metrics_port>/metrics]")
    add_common(status)
    status.set_defaults(func=cmd_status)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except DelayqError as exc:
        print(f"delayq: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
