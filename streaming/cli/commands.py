"""The `delayq` commands that use or inspect a delivery service (options: streaming/cli/main.py)."""
from __future__ import annotations

import argparse
import sys
import time

from streaming.cli.arguments import settings_of


def cmd_produce(args: argparse.Namespace) -> int:
    from streaming.kafka.admin import ensure_topics
    from streaming.producer import DelayProducer

    settings = settings_of(args)
    ensure_topics(settings)
    headers = []
    for item in args.header:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"delayq produce: --header {item!r} is not NAME=VALUE")
        headers.append((name, value.encode()))
    with DelayProducer(settings) as producer:
        handle = producer.send(args.topic, args.value.encode(),
                               key=args.key.encode() if args.key else None, level=args.level,
                               partition=args.partition, headers=headers,
                               deliver_at_ms=args.deliver_at_ms, delay_ms=args.delay_ms)
    print(f"UNIQ_KEY {handle.uniq_key}\nhandle   {handle.token()}\n"
          f"intake   partition {handle.partition} offset {handle.offset}, due {handle.due_ms}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from streaming.producer import DelayProducer, Handle

    try:
        handle = Handle.parse(args.handle)
    except ValueError as exc:
        raise SystemExit(f"delayq cancel: {exc}")
    with DelayProducer(settings_of(args)) as producer:
        producer.cancel(handle)
    print(f"cancel sent for {handle.uniq_key} (due {handle.due_ms})")
    return 0


def cmd_offsets(args: argparse.Namespace) -> int:
    import json
    from contextlib import nullcontext

    from sinks import store
    from streaming.wheel.offsets import delay_offset_table

    settings = settings_of(args)
    checkpoint = store.path(args.checkpoint or settings.checkpoint_path)
    # A checkpoint on a store is read through Spark's Hadoop client.
    with nullcontext() if store.is_local(str(checkpoint)) else _reader_session(settings):
        print(json.dumps(delay_offset_table(checkpoint, settings.intake_topic,
                                            settings.heartbeat_partition)))
    return 0


def _ms(text: str | None) -> int | None:
    if not text:
        return None
    from datetime import datetime, timezone

    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def _reader_session(settings):
    from streaming.spark.session import build_session

    return build_session(settings, {"spark.master": "local[1]", "spark.ui.enabled": "false"})


def cmd_ledger(args: argparse.Namespace) -> int:
    from sinks import store
    from streaming.ledger import lookup
    from streaming.ledger.tables import Tables

    settings = settings_of(args)
    tables = Tables(lambda: _reader_session(settings), store.object_store_options(settings))
    try:
        checkpoint = args.checkpoint or str(settings.checkpoint_path)
        if not tables.by_delta_rs(settings.ledger_path):
            tables.spark   # HDFS is read through Spark's Hadoop client
        if args.summary:
            rows = tables.summary(settings.ledger_path, _ms(args.since), _ms(args.until))
            print(f"{'level':>5} {'delivered':>10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
                  f"{'early':>6}")
            for r in rows:
                print(f"{r['level']:>5} {r['delivered']:>10} {r['p50_ms']:>8} {r['p99_ms']:>8} "
                      f"{r['max_ms']:>8} {r['early']:>6}")
            return 0
        if not args.uniq_key:
            raise SystemExit("delayq ledger: give a UNIQ_KEY or --summary")
        where = lookup.find(tables, settings, args.uniq_key, store.path(checkpoint))
    finally:
        tables.close()
    print(f"{args.uniq_key}: {where.status}")
    for key, value in where.detail.items():
        print(f"  {key:12} {value}")
    return 0 if where.status != "unknown" else 1


def cmd_tables(args: argparse.Namespace) -> int:
    from streaming.ledger.maintenance import maintain, s3_writer_busy

    settings = settings_of(args)
    with _reader_session(settings) as spark:
        checkpoint = str(settings.checkpoint_path)
        busy = settings.store.strip().startswith("s3a://") and s3_writer_busy(
            [checkpoint, checkpoint.rstrip("/") + "-ledger"], int(time.time() * 1000))
        if busy:
            print(f"delayq tables maintain: not now: {busy}", file=sys.stderr)
            return 2
        for path, column in ((settings.ledger_path, "sent_date"),
                             (settings.dead_letter_path, "dead_date")):
            print(maintain(spark, path, column, args.retain_days, args.vacuum_hours))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from streaming.cli.status import fetch, render

    settings = settings_of(args)
    url = args.url or f"http://{settings.metrics_host}:{settings.metrics_port}/metrics"
    try:
        samples = fetch(url)
    except OSError as exc:
        print(f"delayq status: no exporter at {url} ({exc}); is `delayq run` running?",
              file=sys.stderr)
        return 3
    print(render(samples))
    return 0
