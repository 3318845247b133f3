"""The `delayq` commands for local tools: the embedded Kafka broker, a Spark standalone
cluster, a local HDFS, and the benchmark (their options are defined in streaming/cli.py)."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from streaming.arguments import setting_overrides, settings_of


def cmd_kafka(args: argparse.Namespace) -> int:
    from streaming.tools import broker

    settings = settings_of(args)
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


def cmd_cluster(args: argparse.Namespace) -> int:
    from streaming.tools import cluster

    spec = cluster.spec_from_settings(settings_of(args))
    if args.action == "start":
        state = cluster.start(spec)
        print(f"spark cluster running: master {spec.master_url}, web UI {spec.webui}, "
              f"{cluster.alive_workers(state)} workers alive, {state.get('cores')} cores, "
              f"logs in {spec.home}")
    elif args.action == "stop":
        stopped = cluster.stop(spec)
        print(f"spark cluster stopped ({', '.join(stopped)})" if stopped
              else "spark cluster was not running")
    else:
        for key, value in cluster.status(spec).items():
            print(f"{key:15} {value}")
    return 0


def cmd_hdfs(args: argparse.Namespace) -> int:
    from streaming.tools import hdfs

    spec = hdfs.spec_from_settings(settings_of(args))
    if args.action == "start":
        pids = hdfs.start(spec)
        print(f"hdfs running: {spec.uri} (NameNode pid {pids['namenode']}, DataNode pid "
              f"{pids['datanode']}), web UI http://{spec.host}:{spec.http_port}, data {spec.home}")
    elif args.action == "stop":
        stopped = hdfs.stop(spec)
        print(f"hdfs stopped ({', '.join(stopped)})" if stopped else "hdfs was not running")
    else:
        info = hdfs.status(spec)
        for key, value in info.items():
            print(f"{key:15} {value}")
        return 0 if info["state"] == "Operational" else 3
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from streaming.tools.bench import Plan, main as bench, scenarios_of

    plan = Plan.short() if args.short else Plan()
    changes = {name: getattr(args, name) for name in
               ("size", "drain", "drain_rate", "rate", "seconds", "warmup_s", "burst", "burst_lead_s", "backlog",
                "backlog_rate", "backlog_seconds", "restart_down_s", "restart_backlog")
               if getattr(args, name) is not None}
    if args.scenarios:
        changes["scenarios"] = scenarios_of(args.scenarios)
    if args.levels:
        changes["levels"] = tuple(int(v) for v in args.levels.split(","))
    plan = dataclasses.replace(plan, **changes)
    overrides = {**setting_overrides(args), "spark_driver_memory": args.driver_memory}
    if args.wheel_operator:
        overrides["wheel_operator"] = args.wheel_operator
    if args.no_ledger:
        overrides["ledger"] = "false"
    return bench(overrides, plan, Path(args.out) if args.out else None,
                 Path(args.plot) if args.plot else None, keep_data=args.keep_data)
