"""delivery = "exactly_once" on a replicated Kafka cluster, three KRaft nodes on loopback
(streaming/tools/kafka_cluster.py), topics replicated three times with min.insync.replicas 2.
A dispatch task: the leaders of the real topic's partition, of its ready partition and of its
ledger partition, each SIGKILLed in turn under load and restarted. The whole job: the intake's
leader SIGKILLed and kept down longer than the delays, then the job SIGKILLed and started
again. A read_committed reader sees every message once, none early, and the ledger holds one
row per delivery."""
from __future__ import annotations

import time
import uuid
from dataclasses import replace

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from conf import load_settings
from streaming.dispatch.cancels import RINGED
from streaming.ledger.records import ledger_rows
from streaming.kafka.admin import admin_client, create_topic
from streaming.stages import dispatch_config, rules_of
from streaming.tools import kafka_cluster
from streaming.tools.process import free_ports
from tests.faults.conftest import SteadyLoad, check_all_delivered
from tests.integration.test_dispatch import in_thread, stop, write_fired
from tests.support import consume_all, header_map

ROWS = 3000


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    ports = free_ports(2 * kafka_cluster.NODES)
    nodes = kafka_cluster.specs(tmp_path_factory.mktemp("replicated"),
                                load_settings().jars_path / "kafka",
                                ports[:kafka_cluster.NODES], ports[kafka_cluster.NODES:])
    kafka_cluster.start(nodes)
    yield nodes, kafka_cluster.bootstrap(nodes)
    kafka_cluster.stop(nodes)


def leader(bootstrap: str, topic: str, partition: int) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.list_topics(topic, timeout=30).topics[topic].partitions[partition].leader


def test_leaders_killed_under_load_lose_nothing_and_send_nothing_twice(replicated, capsys):
    nodes, bootstrap = replicated
    tag = uuid.uuid4().hex[:8]
    names = {k: f"replicated-{k}-{tag}" for k in ("intake", "ready", "ledger", "real", "dlq")}
    stamped = {"message.timestamp.type": "LogAppendTime", "min.insync.replicas": "2"}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for done in admin.create_topics([
            NewTopic(topic, 2 if k == "real" else 1, 3,
                     config={"min.insync.replicas": "2"} if k == "ready" else stamped)
            for k, topic in names.items()]).values():
        done.result(60)
    settings = load_settings(intake_topic=names["intake"], dlq_topic=names["dlq"])
    config = replace(
        dispatch_config(settings, "run-1", 1_048_576, 1, {}, 1_048_588,
                        rules=rules_of(settings, "")), ring=None,
        consumer={"bootstrap.servers": bootstrap, "group.id": f"replicated-{tag}"},
        producer={"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": "all",
                  "enable.idempotence": True, "message.max.bytes": 1_048_576},
        ready_topic=names["ready"], ledger_topic=names["ledger"], dlq_topic=names["dlq"],
        commit_interval_s=0.1, retry_backoff_s=0.2, direct_max_delay_ms=-1,
        transactional_id=f"replicated-{tag}")
    start = int(time.time() * 1000) + 3000
    due = {f"m{i}": start + i * 40_000 // ROWS for i in range(ROWS)}   # over 40 s
    write_fired(bootstrap, names["intake"], names["ready"], [
        {"uniq": uniq, "due": at, "topic": names["real"], "qid": i % 2}
        for i, (uniq, at) in enumerate(due.items())], batch=0)
    thread, result = in_thread(config)
    by_id = {int(spec.extra["node.id"]): spec for spec in nodes}
    killed = []
    for topic, partition in ((names["real"], 0), (names["ready"], 0), (names["ledger"], 0)):
        time.sleep(4)
        node = leader(bootstrap, topic, partition)
        kafka_cluster.kill(by_id[node])
        killed.append(f"{topic.split('-')[1]} leader {node}")
        deadline = time.monotonic() + 30
        while leader(bootstrap, topic, partition) == node and time.monotonic() < deadline:
            time.sleep(0.5)
        assert leader(bootstrap, topic, partition) != node, "the leadership moved"
        time.sleep(2)
        kafka_cluster.restart(by_id[node])
    records = consume_all(bootstrap, names["real"], expected=ROWS, timeout_s=180, idle_s=3)
    stop(config, bootstrap)
    thread.join(120)
    got = [header_map(r)["UNIQ_KEY"].decode() for r in records]
    assert sorted(got) == sorted(due), f"{len(got)} read for {ROWS}: lost or twice"
    early = [r for r in records if r.timestamp < due[header_map(r)["UNIQ_KEY"].decode()]]
    assert not early, f"{len(early)} early"
    ledger = consume_all(bootstrap, names["ledger"], expected=10**9, timeout_s=60, idle_s=3,
                         done=lambda got: sum(len(ledger_rows(r.value)) for r in got
                                              if r.value) >= ROWS)
    rows = [row for r in ledger if r.value for row in ledger_rows(r.value).to_pylist()]
    assert sorted(row["uniq_key"] for row in rows) == sorted(due), "one ledger row each"
    assert result and result[0]["sent"] + result[0]["skipped"] >= ROWS
    late = max(r.timestamp - due[header_map(r)["UNIQ_KEY"].decode()] for r in records)
    with capsys.disabled():
        print(f"\nreplicated cluster: killed {', '.join(killed)}; {ROWS} messages, lost 0, "
              f"early 0, read twice 0 (read_committed), ledger rows {len(rows)}; "
              f"lateness max {late} ms")


def test_the_job_loses_nothing_and_sends_nothing_twice_as_the_intake_leader_and_the_job_die(
        replicated, job_process, capsys):
    """The job on the cluster under a steady load of levels 0-3 (1-3 s): the intake partition
    0's leader SIGKILLed and kept down 8 s, longer than every delay, then restarted; then the
    job SIGKILLed and started again."""
    nodes, bootstrap = replicated
    job, settings = job_process(bootstrap_servers=bootstrap)
    admin = admin_client(settings)
    real = f"real-{settings.intake_topic}"
    create_topic(admin, real, 2, {"message.timestamp.type": "LogAppendTime"})
    admin.close()
    job.start()
    load = SteadyLoad(settings, real)
    load.start()
    by_id = {int(spec.extra["node.id"]): spec for spec in nodes}
    time.sleep(5)
    node = leader(bootstrap, settings.intake_topic, 0)
    kafka_cluster.kill(by_id[node])
    time.sleep(8)
    kafka_cluster.restart(by_id[node])
    time.sleep(3)
    job.kill()
    job.start()
    time.sleep(5)
    load.stop()
    outcome = check_all_delivered(settings, real, load.sent, unacknowledged=load.unacknowledged)
    assert outcome.duplicates == 0, f"{outcome.duplicates} read twice (read_committed)"
    every = set(load.sent)
    ledger = consume_all(bootstrap, settings.ledger_topic, expected=10**9, timeout_s=60, idle_s=3,
                         done=lambda got: {row["uniq_key"] for r in got if r.value
                                           for row in ledger_rows(r.value).to_pylist()} >= every)
    keys = [row["uniq_key"] for r in ledger if r.value for row in ledger_rows(r.value).to_pylist()
            if row["uniq_key"] not in load.unacknowledged and row["status"] != RINGED]
    assert sorted(keys) == sorted(every), "one ledger row per delivery (besides a ring's hand-over)"
    job.stop()
    with capsys.disabled():
        print(f"\nreplicated cluster, the job: intake leader {node} down 8 s, the job killed; "
              f"{len(every)} messages, lost 0, early 0, read twice 0 (read_committed), "
              f"ledger rows {len(keys)}; lateness max {max(outcome.lateness_ms)} ms")
