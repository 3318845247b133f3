"""Fault tests run the job as its own process (`delayq run`), so it can be killed for real."""
from __future__ import annotations

import contextlib

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from streaming.tools.process import children, kill_session
from tests.conftest import PROJECT

READY_LINE = "delayq running"


class JobProcess:
    def __init__(self, env: dict[str, str], log: Path, command: list[str]):
        self.env = env
        self.command = command
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.stuck = ""   # after a stop that timed out: where its JVMs were

    def start(self, timeout_s: float = 240) -> None:
        self.starts += 1
        ready_before = self.log.read_text(errors="replace").count(READY_LINE) \
            if self.log.exists() else 0   # a start that was refused printed none
        out = open(self.log, "a")
        out.write(f"\n==== start {self.starts} ====\n")
        out.flush()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streaming.cli.main", *self.command], cwd=PROJECT, env=self.env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace")
            if text.count(READY_LINE) > ready_before:
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"delayq run exited {self.proc.returncode}:\n{text[-3000:]}")
            time.sleep(0.5)
        raise AssertionError(f"delayq run not ready in {timeout_s} s:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the whole process group: the Python driver and its JVM, like a lost host (and
        what spark-submit started in a session of its own, which would keep the job's ports)."""
        if self.proc and self.proc.poll() is None:
            tree = descendants(self.proc.pid)
            kill_session(self.proc)
            for pid in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM to the driver's Python process alone, as `docker stop` and Kubernetes send
        it to a container's first process: a clean stop (its Spark JVM, a child, must not get
        the signal too, or it stops the query mid-batch). Then whatever is left of the group."""
        self.stuck = ""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:   # say where the JVMs were before the kill
                self.stuck = jvm_threads(descendants(self.proc.pid))
        if self.proc:
            kill_session(self.proc)   # a JVM that outlived its driver


def descendants(pid: int) -> list[int]:
    """`pid`'s children, theirs, and so on (spark-submit runs in a session of its own)."""
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def real_topic(settings, partitions: int = 2) -> str:
    """A real topic for the job's deliveries, stamped with the broker's append time."""
    from streaming.kafka.admin import admin_client, create_topic
    admin = admin_client(settings)
    real = f"real-{settings.intake_topic}"
    create_topic(admin, real, partitions, {"message.timestamp.type": "LogAppendTime"})
    admin.close()
    return real


def ledger_records(settings, partition: int) -> list[tuple[int, list[str]]]:
    """Ledger partition `partition`'s records (ready partition `partition`'s dispatch task's), as
    a read_committed reader sees them, oldest first: the pid that sent each (its SENDER header)
    and the UNIQ_KEYs of its outcome rows (not a timer's hand-over to the ring, `ringed`)."""
    from streaming.dispatch.cancels import RINGED
    from confluent_kafka import Consumer, TopicPartition

    from streaming.ledger.records import SENDER, ledger_rows
    reader = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": "senders",
                       "isolation.level": "read_committed"})
    part = TopicPartition(settings.ledger_topic, partition)
    end = reader.get_watermark_offsets(part, timeout=10)[1]
    reader.assign([TopicPartition(settings.ledger_topic, partition, 0)])
    records, at, deadline = [], 0, time.monotonic() + 30
    while at < end and time.monotonic() < deadline:
        for msg in reader.consume(500, timeout=0.5):
            if not msg.error() and msg.value():   # not a probe
                rows = ledger_rows(msg.value()).to_pydict()
                records.append((int(dict(msg.headers())[SENDER].decode().split(":")[1]),
                                [key for key, status in zip(rows["uniq_key"], rows["status"])
                                 if status != RINGED]))
        at = reader.position([part])[0].offset   # past aborted records and markers too
    reader.close()
    return records


def ledger_senders(settings, partition: int) -> list[int]:
    """The pids that sent ledger partition `partition`'s records, oldest first."""
    return [pid for pid, _ in ledger_records(settings, partition)]


def check_ledgered_once(settings, load: "SteadyLoad", timeout_s: float = 60) -> None:
    """One ledger row on the ledger topic (read_committed) for each message `load` sent (and
    for each of its unacknowledged sends that was delivered), none for anything else."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = ledger_keys(settings)
        if set(rows) >= set(load.sent) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert set(rows) - load.unacknowledged == set(load.sent), \
        f"{len(set(load.sent) - set(rows))} without a ledger row"
    twice = {key: n for key, n in rows.items() if n > 1}
    assert not twice, f"{len(twice)} with more than one ledger row, e.g. {list(twice)[:3]}"


def ledger_keys(settings) -> Counter:
    """How many ledger rows each UNIQ_KEY has on the ledger topic (read_committed)."""
    from confluent_kafka import Consumer
    reader = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": "senders"})
    parts = len(reader.list_topics(settings.ledger_topic, timeout=30)
                .topics[settings.ledger_topic].partitions)
    reader.close()
    return Counter(key for p in range(parts) for _, keys in ledger_records(settings, p)
                   for key in keys)


def jvm_threads(pids: list[int], names=("stream execution thread", '"main"')) -> str:
    """The stacks of the threads named `names` in each Java process of `pids` (jcmd)."""
    found = []
    for pid in pids:
        try:
            if not Path(f"/proc/{pid}/exe").resolve().name == "java":
                continue
            dump = subprocess.run(["jcmd", str(pid), "Thread.print"], capture_output=True,
                                  text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        found += [f"JVM {pid}: {block}" for block in dump.split("\n\n")
                  if any(name in block.split("\n", 1)[0] for name in names)]
    return "\n\n".join(found)


@pytest.fixture
def job_process(kafka_bootstrap, work_dir):
    """Factory: a `delayq run` process (or `command`, e.g. ["submit", …]) on fresh topics;
    returns (JobProcess, settings)."""
    from conf import load_settings

    procs = []

    def make(command: list[str] | None = None, **overrides):
        tag = uuid.uuid4().hex[:8]
        values = dict(bootstrap_servers=kafka_bootstrap, data_dir=str(work_dir / f"fault-{tag}"),
                      intake_topic=f"intake-{tag}", dlq_topic=f"intake-{tag}.DLQ",
                      delay_levels="1s 2s 3s", spark_master="local[*]",
                      # Immediate and level-1 messages go the dispatch tasks' own way from the
                      # intake, levels 2 and 3 through the wheel: both paths under each fault.
                      dispatch_direct_max_delay_ms=1000,
                      # Timers from 1 s to 8 s through the dispatch tasks' rings.
                      ring_slots=6, ring_slot_ms=2000, ring_read_lead_ms=1000,
                      ring_write_ms=200,
                      spark_driver_memory="1g", ledger_interval="10s")
        values.update(overrides)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_")}
        env.update({f"DELAYQ_{k.upper()}": str(v) for k, v in values.items()})
        env["PYTHONUNBUFFERED"] = "1"
        settings = load_settings(**values)
        proc = JobProcess(env, work_dir / f"job-{tag}.log", command or ["run"])
        procs.append(proc)
        return proc, settings

    yield make
    for proc in procs:
        proc.kill()


class SteadyLoad(threading.Thread):
    """Messages of random levels to one real topic, one every `interval_s`, until stopped; with
    `timers`, every other one a timer due 1.5 to 7.5 s after its append (the dispatch tasks'
    rings of the fault tests' settings).
    Only acknowledged sends count as sent; a send the broker refused (it may be down) is
    retried as a new message, as a real producer would. A send whose acknowledgement was lost
    may still have been written: its UNIQ_KEY is kept in `unacknowledged`, may be delivered,
    and if it is, must not be early."""

    def __init__(self, settings, real: str, levels=(0, 1, 2, 3), interval_s: float = 0.02,
                 timers: bool = True):
        super().__init__(name="steady-load", daemon=True)
        self.settings, self.real, self.levels, self.interval_s = settings, real, levels, interval_s
        self.timers = timers
        self.sent: dict[str, int] = {}  # UNIQ_KEY -> due_ms
        self.level_of: dict[str, int] = {}
        self.failed = 0
        self.unacknowledged: set[str] = set()
        self._stop_event = threading.Event()

    def run(self) -> None:
        from kafka.errors import KafkaError

        from streaming.producer import DelayProducer, new_uniq_key

        rng = random.Random(11)
        with DelayProducer(self.settings) as producer:
            i = 0
            while not self._stop_event.is_set():
                uniq = new_uniq_key()
                try:
                    when = ({"delay_ms": rng.randint(1_500, 7_500)} if self.timers and i % 2
                            else {"level": rng.choice(self.levels)})
                    handle = producer.send(self.real, f"m{i}".encode(), key=str(i).encode(),
                                           uniq_key=uniq, **when)
                    self.sent[handle.uniq_key] = handle.due_ms
                    self.level_of[handle.uniq_key] = handle.level
                except KafkaError:
                    self.failed += 1
                    self.unacknowledged.add(uniq)
                i += 1
                self._stop_event.wait(self.interval_s)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=120)


@dataclass
class Outcome:
    records: list
    duplicates: int
    lateness_ms: list[int] = field(default_factory=list)

    def twice(self) -> set[str]:
        """The UNIQ_KEYs read more than once."""
        from tests.support import header_map

        seen: set[str] = set()
        twice = set()
        for record in self.records:
            uniq = header_map(record)["UNIQ_KEY"].decode()
            (twice if uniq in seen else seen).add(uniq)
        return twice


def check_late(outcome: Outcome, sent: dict[str, int], late_ms: int, after_ms: int = 0) -> int:
    """Every delivery of `outcome` at most `late_ms` after its due time, or after `after_ms` (a
    fault's end) for one due before it; returns the most it was so."""
    from tests.support import header_map

    worst, which, late = 0, None, []
    for record in outcome.records:
        headers = header_map(record)
        uniq = headers["UNIQ_KEY"].decode()
        if uniq not in sent:
            continue
        by = record.timestamp - max(sent[uniq], after_ms)
        if by > late_ms:   # what it was, for the one who reads the failure
            when = {k: v.decode() for k, v in headers.items() if k.startswith(("DELAY", "TIMER"))}
            late.append(f"{uniq} ({when}, due {sent[uniq]}) at {record.partition}:"
                        f"{record.offset}, {record.timestamp}: {by} ms")
        if by > worst:
            worst, which = by, uniq
    assert worst <= late_ms, f"{which} arrived {worst} ms after its due time or the fault's " \
                             f"end (bound {late_ms} ms); {len(late)} late: {late[:10]}"
    return worst


def check_all_delivered(settings, real: str, sent: dict[str, int], timeout_s: float = 180,
                        unacknowledged: set[str] = frozenset(),
                        committed: bool = True) -> Outcome:
    """Every sent UNIQ_KEY delivered to `real` with its due time, none early; duplicates only
    with the same UNIQ_KEY (any other key fails, except a send whose acknowledgement was lost:
    it may arrive, never before the due time it carries). Returns what arrived, for a
    read_committed consumer unless `committed` is False."""
    from tests.support import consume_all, header_map

    every_key = lambda got: {header_map(r)["UNIQ_KEY"].decode() for r in got} >= set(sent)
    records = consume_all(settings.bootstrap, real, expected=len(sent), timeout_s=timeout_s,
                          idle_s=5, done=every_key, committed=committed)
    counts: dict[str, int] = {}
    lateness = []
    for record in records:
        headers = header_map(record)
        uniq = headers["UNIQ_KEY"].decode()
        if uniq in unacknowledged:
            assert record.timestamp >= int(headers["DELIVER_MS"]), f"{uniq} early"
            continue
        assert uniq in sent, f"unknown delivery {uniq}"
        assert int(headers["DELIVER_MS"]) == sent[uniq]
        assert record.timestamp >= sent[uniq], f"{uniq} early by {sent[uniq] - record.timestamp} ms"
        counts[uniq] = counts.get(uniq, 0) + 1
        lateness.append(record.timestamp - sent[uniq])
    lost = set(sent) - set(counts)
    assert not lost, f"{len(lost)} of {len(sent)} lost, e.g. {sorted(lost)[:5]}"
    return Outcome(records, sum(n - 1 for n in counts.values()), lateness)
