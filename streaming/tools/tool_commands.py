"""The `delayq` commands for local tools and their options: the embedded Kafka broker, a Spark
standalone cluster, a local HDFS, a local S3 server, the demo and the benchmark."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from streaming.cli.arguments import add_common, log_to_stderr, setting_overrides, settings_of


def _shown(info: dict, up: str | None = None) -> int:
    """A local service's status, a line per field; 3 when its `up` field is false (not running)."""
    width = max(map(len, info)) + 2
    for key, value in info.items():
        print(f"{key:{width}} {value}")
    return 0 if up is None or info[up] else 3


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
        return _shown(broker.status(spec), "answers")
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
        _shown(cluster.status(spec))
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
        _shown(info)
        return 0 if info["state"] == "Operational" else 3
    return 0


def cmd_s3(args: argparse.Namespace) -> int:
    from streaming.tools import s3

    settings = settings_of(args)
    spec = s3.spec_from_settings(settings)
    if args.action == "start":
        bucket = s3.bucket_of(settings.store)
        pid = s3.start(spec, (bucket,))
        key, _ = spec.credentials()
        secret = "the s3_secret_key setting" if spec.secret_key else spec.home / "secret"
        print(f"s3 running: {spec.endpoint} (s3proxy pid {pid}), bucket {bucket}, access key "
              f"{key}, secret in {secret}; objects in its memory until it stops")
    elif args.action == "stop":
        print("s3 stopped" if s3.stop(spec) else "s3 was not running")
    else:
        return _shown(s3.status(spec), "answers")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from streaming.tools.bench import Plan, main as bench, scenarios_of

    plan = Plan.short() if args.short else Plan()
    changes = {name: getattr(args, name) for name in
               ("size", "drain", "drain_rate", "rate", "seconds", "warmup_s", "burst", "burst_lead_s",
                "timers_spread_s", "scattered_fill_s", "scattered_spread_s", "backlog",
                "backlog_rate",
                "backlog_seconds", "restart_down_s", "restart_backlog")
               if getattr(args, name) is not None}
    if args.scenarios:
        changes["scenarios"] = scenarios_of(args.scenarios)
    if args.levels:
        changes["levels"] = tuple(int(v) for v in args.levels.split(","))
    plan = dataclasses.replace(plan, **changes)
    overrides = {**setting_overrides(args), "spark_driver_memory": args.driver_memory}
    if args.no_ledger:
        overrides["ledger"] = "false"
    return bench(overrides, plan, Path(args.out) if args.out else None,
                 Path(args.plot) if args.plot else None, keep_data=args.keep_data)


def cmd_demo(args: argparse.Namespace) -> int:
    from streaming.tools.demo import run_demo

    settings = settings_of(args)
    log_to_stderr(settings.log_level)
    return run_demo(settings)


def add_tool_parsers(sub: argparse._SubParsersAction) -> None:
    """cluster (a master for `delayq submit`), demo, bench, kafka, hdfs and s3."""
    cluster_cmd = sub.add_parser("cluster", help="a local Spark standalone cluster (Master + Workers)")
    add_common(cluster_cmd)
    cluster_cmd.add_argument("action", choices=("start", "stop", "status"))
    cluster_cmd.set_defaults(func=cmd_cluster)

    demo = sub.add_parser("demo", help="run the service and show deliveries of a wave of demo messages")
    add_common(demo)
    demo.set_defaults(func=cmd_demo)
    _add_bench_parser(sub)
    _add_service_parsers(sub)


def _add_bench_parser(sub: argparse._SubParsersAction) -> None:
    """bench: the scenarios, their counts and rates, and the job under test."""
    bench = sub.add_parser("bench", help="throughput and lateness against the raw Kafka pipe "
                                         "(own broker unless Kafka is configured)")
    bench.add_argument("--short", action="store_true",
                       help="the CI form: small counts, no restart scenario")
    bench.add_argument("--scenarios",
                       help="comma separated, run in this order whatever the order given: "
                            "raw,raw-steady,drain,steady,timers,burst,scattered,backlog,"
                            "restart,first-minute (the default), "
                            "cluster (on a local standalone cluster: "
                            "deliveries per executor)")
    bench.add_argument("--size", type=int, help="message value bytes [1024]")
    bench.add_argument("--drain", type=int, help="messages preloaded for raw and drain [200000]")
    bench.add_argument("--drain-rate", type=float,
                       help="drain: msg/s of the preload, 0 = as fast as the broker takes it [0]")
    bench.add_argument("--rate", type=float, help="steady: msg/s [20000]")
    bench.add_argument("--seconds", type=float, help="steady: seconds of load [60]")
    bench.add_argument("--warmup-s", type=float,
                       help="steady: seconds of load before those, their lateness reported "
                            "apart [0]")
    bench.add_argument("--levels", help="steady: levels, round robin [1,2]")
    bench.add_argument("--burst", type=int, help="burst: timers due in the same second [500000]")
    bench.add_argument("--burst-lead-s", type=float, help="burst: seconds from the first send to the due time [90]")
    bench.add_argument("--timers-spread-s", type=float,
                       help="timers: due within this after their append, every header form, "
                            "a fifth past or within 3 s [60]")
    bench.add_argument("--scattered-fill-s", type=float,
                       help="scattered: seconds of load before the measured --seconds [600]")
    bench.add_argument("--scattered-spread-s", type=float,
                       help="scattered: timer delays uniform from 0 to this [600]")
    bench.add_argument("--backlog", type=int,
                       help="backlog: timers pending over 2 h … 30 days [10000000]")
    bench.add_argument("--backlog-rate", type=float,
                       help="backlog: msg/s of the near load before and after it [1000]")
    bench.add_argument("--backlog-seconds", type=float,
                       help="backlog: seconds of each near load [30]")
    bench.add_argument("--restart-down-s", type=float,
                       help="restart: seconds the killed job stays down [0]")
    bench.add_argument("--restart-backlog", type=int,
                       help="restart: level-1 messages sent while it is down (an outage's "
                            "backlog) [0]")
    bench.add_argument("--driver-memory", default="4g", help="Spark driver memory")
    bench.add_argument("--no-ledger", action="store_true", help="run the job without the Delta ledger")
    bench.add_argument("--out", help="JSON result [<data_dir>/bench-*.json]")
    bench.add_argument("--plot", help="PNG of lateness over time [next to the JSON]")
    bench.add_argument("--keep-data", action="store_true",
                       help="keep the run's folder (broker log, checkpoint, sent and read "
                            "arrays); a clean run's is removed, a failed run's kept")
    add_common(bench)
    bench.set_defaults(func=cmd_bench)


def _add_service_parsers(sub: argparse._SubParsersAction) -> None:
    """kafka, hdfs and s3: the local broker, file system and object store."""
    kafka = sub.add_parser("kafka", help="start, stop or inspect the embedded local Kafka broker")
    kafka.add_argument("action", choices=("start", "stop", "status"))
    add_common(kafka)
    kafka.set_defaults(func=cmd_kafka)

    hdfs = sub.add_parser("hdfs", help="start, stop or inspect a local HDFS (NameNode + DataNode) "
                                       "for a store on hdfs://")
    hdfs.add_argument("action", choices=("start", "stop", "status"))
    add_common(hdfs)
    hdfs.set_defaults(func=cmd_hdfs)

    s3 = sub.add_parser("s3", help="start, stop or inspect a local S3 server (s3proxy) for a "
                                   "store on s3a://")
    s3.add_argument("action", choices=("start", "stop", "status"))
    add_common(s3)
    s3.set_defaults(func=cmd_s3)
