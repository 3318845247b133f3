"""`delayq demo`: the service on its embedded default, a wave of messages at several levels,
and each delivery printed as it arrives with its level, due time and lateness."""
from __future__ import annotations

import threading
from datetime import datetime, timezone

from kafka import KafkaConsumer

from conf.settings import Settings
from streaming.kafka.admin import admin_client, create_topic
from streaming.kafka.config import python_client_config
from streaming.producer import DelayProducer
from streaming.runner import running_job, stop_on_signals, wait
from streaming.tools.broker import embedded

DEMO_TOPIC = "delayq-demo"
DEMO_LEVELS = (0, 1, 2, 3, 4)


def _clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def _watch(settings: Settings, expected: dict[str, int], done: threading.Event) -> None:
    consumer = KafkaConsumer(DEMO_TOPIC, auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=500, **python_client_config(settings))
    lateness = []
    try:
        while expected and not done.is_set():
            for record in consumer:
                headers = dict(record.headers)
                uniq = headers.get("UNIQ_KEY", b"").decode()
                if uniq not in expected:
                    continue
                level = expected.pop(uniq)
                due = int(headers["DELIVER_MS"])
                late = record.timestamp - due
                lateness.append(late)
                name = "now" if level == 0 else settings.delay_levels.split()[level - 1]
                print(f"  delivered  level {level:>2} ({name:>4})  {record.value.decode():<22} "
                      f"due {_clock(due)}  arrived {_clock(record.timestamp)}  late {late:>5} ms")
    finally:
        consumer.close()
    if lateness:
        lateness.sort()
        print(f"\nall {len(lateness)} demo messages delivered; lateness p50 "
              f"{lateness[len(lateness) // 2]} ms, max {lateness[-1]} ms, early "
              f"{sum(1 for x in lateness if x < 0)}")
    done.set()


def run_demo(settings: Settings) -> int:
    stop = threading.Event()
    print(f"delayq demo: Kafka {settings.bootstrap} ({'embedded' if settings.embedded else 'configured'}), "
          f"Spark {settings.spark_master}, data in {settings.data_path}")
    with embedded(settings), running_job(settings) as job:
        stop_on_signals(stop)  # after the SparkContext, which installs its own SIGINT handler
        admin = admin_client(settings)
        create_topic(admin, DEMO_TOPIC, 2)
        admin.close()
        print(f"job running (Spark UI {job.spark.sparkContext.uiWebUrl or 'off'}); levels: "
              f"{settings.delay_levels}")
        expected: dict[str, int] = {}
        done = threading.Event()
        watcher = threading.Thread(target=_watch, args=(settings, expected, done), daemon=True)
        levels = [lv for lv in DEMO_LEVELS if lv <= len(settings.level_delays_ms)]
        with DelayProducer(settings) as producer:
            for round_ in range(2):
                for level in levels:
                    handle = producer.send(DEMO_TOPIC, f"order-{round_}-level-{level}".encode(),
                                           key=f"k{level}".encode(), level=level,
                                           headers=[("source", b"demo")])
                    expected[handle.uniq_key] = level
            watcher.start()
            print(f"sent {len(expected)} messages at levels {levels} to {settings.intake_topic}; "
                  f"waiting for deliveries on topic {DEMO_TOPIC}:")
        while not done.is_set() and not stop.is_set() and job.query.isActive:
            done.wait(0.5)
        print("\nthe service keeps running; try:  delayq produce --topic delayq-demo --level 2 hello")
        print("Ctrl-C to stop.")
        wait(job, stop)
    return 0
