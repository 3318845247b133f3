"""delivery = "exactly_once" on a replicated Kafka cluster, three KRaft nodes on loopback
(streaming/tools/kafka_cluster.py), topics replicated three times with min.insync.replicas 2.
A dispatch task: the leaders of the real topic's partition, of its ready partition and of its
ledger partition, each SIGKILLed in turn under load and restarted. The whole job: the intake's
leader SIGKILLed and kept down longer than the delays, then the job SIGKILLed and started
again. A real topic whose one replica's node is killed: its rows wait while the others leave.
A read_committed reader sees every message once, none early, and the ledger holds one row per
delivery."""
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
    for spec in nodes:   # killed: their logs are thrown away (stopped one by one: 32 s)
        kafka_cluster.kill(spec)


def leader(bootstrap: str, topic: str, partition: int) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.list_topics(topic, timeout=30).topics[topic].partitions[partition].leader


def task_config(bootstrap: str, names: dict, name: str, **overrides):
    """A dispatch task's config (exactly_once, transactional.id and group `name`) over the
    topics `names`, reading no intake itself."""
    settings = load_settings(intake_topic=names["intake"], dlq_topic=names["dlq"])
    return replace(
        dispatch_config(settings, "run-1", 1_048_576, 1, {}, 1_048_588,
                        rules=rules_of(settings, "")), ring=None,
        consumer={"bootstrap.servers": bootstrap, "group.id": name},
        producer={"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": "all",
                  "enable.idempotence": True, "message.max.bytes": 1_048_576},
        ready_topic=names["ready"], ledger_topic=names["ledger"], dlq_topic=names["dlq"],
        commit_interval_s=0.1, retry_backoff_s=0.2, direct_max_delay_ms=-1,
        transactional_id=name, **overrides)


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
    config = task_config(bootstrap, names, f"replicated-{tag}")
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


# How late rows may be while a node is killed: the leadership of what it led moves (measured:
# 7 s when a leader was killed), the transaction that waits on the stuck topic is aborted.
STUCK_LATE_MS = 15_000


def test_a_real_topic_without_a_leader_holds_only_its_own_rows(replicated, capsys):
    """A dispatch task (exactly_once) sends to two real topics; its own topics and one real
    topic are led by node 1, the other real topic has one replica, on node 3. Node 3 killed
    under load: that topic has no leader, every send to it waits (librdkafka would retry it for
    the transaction's timeout, a minute, holding it and every row of the task, and again for
    each transaction after), until the transaction waiting on
    it is aborted (`dispatch_ack_check_ms`) and its rows, read again, wait aside. The other
    topic's 1,500 rows keep leaving, none more than STUCK_LATE_MS late; node 3 back, the stuck
    topic's 500 rows arrive, each once (read_committed), none early, none dead-lettered, none
    more than STUCK_LATE_MS after its due time or the node's return."""
    nodes, bootstrap = replicated
    by_id = {int(spec.extra["node.id"]): spec for spec in nodes}
    tag = uuid.uuid4().hex[:8]
    names = {k: f"stuck-{k}-{tag}" for k in ("intake", "ready", "ledger", "real", "dlq", "lone")}
    stamped = {"message.timestamp.type": "LogAppendTime"}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for done in admin.create_topics([
            NewTopic(topic, num_partitions=1,
                     replica_assignment=[[3]] if k == "lone" else [[1, 2, 3]],
                     config={} if k == "ready" else stamped)
            for k, topic in names.items()]).values():
        done.result(60)
    config = task_config(bootstrap, names, f"stuck-{tag}", ack_check_s=0.5)
    start = int(time.time() * 1000) + 15_000
    due = {f"s{i}": start - 4000 if i < 10 else start + 6 * i for i in range(510)}
    due.update({f"k{i}": start - 3000 + 6 * i for i in range(1_500)})
    topic_of = lambda uniq: names["lone" if uniq[0] == "s" else "real"]   # noqa: E731
    write_fired(bootstrap, names["intake"], names["ready"], [
        {"uniq": uniq, "due": at, "topic": topic_of(uniq)}
        for uniq, at in sorted(due.items(), key=lambda item: item[1])], batch=0)
    assert time.time() * 1000 < start - 6000, "the rows were written in time"
    thread, result = in_thread(config)
    try:
        consume_all(bootstrap, names["lone"], expected=10, timeout_s=60)   # the task knows it
        time.sleep(max(0.0, start - 3000 - time.time() * 1000) / 1000)
        kafka_cluster.kill(by_id[3])
        kept = consume_all(bootstrap, names["real"], expected=1_500, timeout_s=60)
    finally:
        kafka_cluster.restart(by_id[3])
    back_ms = int(time.time() * 1000)
    freed = consume_all(bootstrap, names["lone"], expected=510, timeout_s=120, idle_s=2)
    stop(config, bootstrap)
    thread.join(120)
    assert thread.is_alive() is False and result, "the task ended on its stop record"
    worst = {}
    for got, wanted, after_ms in [(kept, "k", 0), (freed, "s", back_ms)]:
        uniqs = [header_map(r)["UNIQ_KEY"].decode() for r in got]
        assert sorted(uniqs) == sorted(u for u in due if u[0] == wanted), \
            f"every {wanted} row once (read_committed)"
        assert all(r.timestamp >= due[u] for r, u in zip(got, uniqs)), "none early"
        worst[wanted] = max(r.timestamp - max(due[u], after_ms) for r, u in zip(got, uniqs))
        assert worst[wanted] <= STUCK_LATE_MS, f"{wanted} rows up to {worst[wanted]} ms late"
    assert result[0]["dead"] == 0, "none dead-lettered"
    with capsys.disabled():
        print(f"\nreal topic without a leader (node 3 killed): the other topic's 1500 rows at "
              f"most {worst['k']} ms late; its 500 at most {worst['s']} ms after their due "
              f"time or the node's return; lost 0, early 0, read twice 0")


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
