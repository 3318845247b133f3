"""The dispatch task: one per partition of the ready topic, long-running in a Spark executor
(streaming/dispatcher.py starts and supervises them). It consumes its partition, keeps the
fired rows in a heap by due time, produces each to its real topic at its due time and never
before, then its ledger row to the ledger topic, and commits the ready partition's offset only
below the lowest row not yet done (delivered and its ledger row acknowledged, or dead-lettered
and acknowledged). No Spark import: the loop runs in a plain Python worker and is tested on a
real broker without Spark.

A restart (a lost executor, a crash, a clean stop) reads the partition again from the committed
offset. A row whose message the ledger topic already holds is skipped: the commit's metadata
names the ledger offset from which the task's last deliveries can be found, and the scan reaches
`replay_window_s` further back, so neither the rows a crashed task sent after its last commit nor
a wheel batch fired again after a crash go out twice. What is sent twice is what was delivered
but not yet in the ledger when the task died.
"""
from __future__ import annotations

import heapq
import json
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from state import headers as H

log = logging.getLogger(__name__)

# Headers the wheel appends to a fired row after the message's own, removed here.
READY_TOPIC = "DELAYQ_READY_TOPIC"
READY_QID = "DELAYQ_READY_QID"
READY_LEVEL = "DELAYQ_READY_LEVEL"
READY_FROM = "DELAYQ_READY_FROM"      # "<intake partition>-<intake offset>-<append ms>"
READY_HEADERS = (READY_TOPIC, READY_QID, READY_LEVEL, READY_FROM)
# The stop record the driver writes to every ready partition; its value is the run's id.
READY_STOP = "DELAYQ_READY_STOP"


@dataclass
class DispatchConfig:
    """What one dispatch task needs, pickled to the executor."""

    consumer: dict          # librdkafka settings (bootstrap, security, group.id)
    producer: dict          # librdkafka settings of the real-topic and ledger producer
    ready_topic: str
    ledger_topic: str
    dlq_topic: str
    run_id: str
    commit_interval_s: float = 1.0
    max_held: int = 500_000           # rows held before consumption pauses
    retry_backoff_s: float = 1.0      # a transient send failure is retried this much later
    probe_interval_s: float = 30.0    # an idle task measures its clock against the broker's
    replay_window_s: float = 60.0     # what a restart skips reaches this far before its commit


class Row:
    """A fired message held by a dispatch task; `offset` is its ready partition's."""

    __slots__ = ("due_ms", "ipart", "ioff", "offset", "topic", "partition", "key", "value",
                 "headers", "level", "append_ms", "uniq_key")

    def __init__(self, due_ms, ipart, ioff, offset, topic, partition, key, value, headers,
                 level, append_ms, uniq_key):
        self.due_ms, self.ipart, self.ioff, self.offset = due_ms, ipart, ioff, offset
        self.topic, self.partition, self.key, self.value = topic, partition, key, value
        self.headers, self.level, self.append_ms, self.uniq_key = headers, level, append_ms, uniq_key

    def order(self) -> tuple:
        """Its place in the heap: due time, then intake position (one key's order)."""
        return (self.due_ms, self.ipart, self.ioff, self.offset, self)


def identity(uniq_key: str, due_ms: int) -> int:
    """A delivered message as the restart's skip knows it: its UNIQ_KEY and due time (a
    producer's resend of a message is due at another time and is sent again)."""
    return hash((uniq_key, due_ms))


def ready_row(offset: int, key, value, headers: list | None) -> Row:
    """A fired row from its ready record: the message's own headers (with UNIQ_KEY and
    DELIVER_MS, as delivered) and the restore headers the wheel appended after them."""
    headers = list(headers or [])
    extra = {}
    while headers and headers[-1][0] in READY_HEADERS:
        name, raw = headers.pop()
        extra[name] = raw
    uniq = due = None
    for name, raw in reversed(headers):   # the wheel writes UNIQ_KEY and DELIVER_MS last
        if name == H.DELIVER_MS and due is None:
            due = int(raw)
        elif name == H.UNIQ_KEY and uniq is None:
            uniq = raw.decode()
        if uniq is not None and due is not None:
            break
    ipart, ioff, append_ms = (int(x) for x in extra[READY_FROM].split(b"-"))
    qid = extra.get(READY_QID)
    return Row(due, ipart, ioff, offset, extra[READY_TOPIC].decode(),
               int(qid) if qid else None, key, value, headers, int(extra[READY_LEVEL]),
               append_ms, uniq)


class Offsets:
    """The ready partition's rows read and not yet done, and the commit point: the lowest of
    them with the ledger offset noted when it was read (every ledger row of a ready row at or
    above it was produced after that read, so lies at or after that ledger offset), or, with
    none open, the next offset to read and the ledger's end now."""

    def __init__(self, position: int):
        self.position = position
        self._open: dict[int, int] = {}

    def read(self, offset: int, ledger_end: int) -> None:
        self._open[offset] = ledger_end
        self.position = offset + 1

    def skip(self, offset: int) -> None:
        self.position = offset + 1

    def done(self, offset: int) -> None:
        self._open.pop(offset, None)

    def __len__(self) -> int:
        return len(self._open)

    def commit_point(self, ledger_end: int) -> tuple[int, int]:
        if not self._open:
            return self.position, ledger_end
        low = min(self._open)
        return low, self._open[low]


class Skew:
    """How far this host's clock may run ahead of the broker's, from acknowledged records of a
    LogAppendTime topic: the broker stamped each before this host saw its acknowledgement, so
    (local time at the acknowledgement − broker stamp) bounds the lead from above. The smallest
    bound of the last window is kept; never below 0 (a clock behind only makes rows late)."""

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.time):
        self._window_s, self._clock = window_s, clock
        self._best: float | None = None
        self._since = clock()
        self.measured = False

    def observe(self, broker_ms: int) -> None:
        bound = self._clock() * 1000 - broker_ms
        now = self._clock()
        if self._best is None or now - self._since > self._window_s:
            self._best, self._since = bound, now
        else:
            self._best = min(self._best, bound)
        self.measured = True

    def ahead_ms(self) -> float:
        return max(0.0, self._best or 0.0)


# Send failures that will not pass on a retry: the row is dead-lettered with the reason.
def _permanent_codes():
    from confluent_kafka import KafkaError as E
    return {E.UNKNOWN_TOPIC_OR_PART: "REAL_TOPIC '{topic}' does not exist",
            E._UNKNOWN_TOPIC: "REAL_TOPIC '{topic}' does not exist",
            E._UNKNOWN_PARTITION: "REAL_QID {partition} is out of range for topic '{topic}'",
            E.MSG_SIZE_TOO_LARGE: "message of {size} bytes is too large for topic '{topic}'",
            E.RECORD_LIST_TOO_LARGE: "message of {size} bytes is too large for topic '{topic}'",
            E.TOPIC_AUTHORIZATION_FAILED: "not authorized to write to topic '{topic}'",
            E.INVALID_RECORD: "topic '{topic}' refused the record as invalid",
            E.TOPIC_EXCEPTION: "REAL_TOPIC '{topic}' is not a valid topic"}


def refusal(err, row: Row) -> str | None:
    """The dead-letter reason of a send failure that is permanent, by the client's error code;
    None for a transient one (retried). A fatal producer error is raised: the task restarts
    with a new producer."""
    if err.fatal():
        from confluent_kafka import KafkaException
        raise KafkaException(err)
    text = _permanent_codes().get(err.code())
    if text is None:
        return None
    size = len(row.key or b"") + len(row.value or b"") + sum(
        len(k) + len(v or b"") for k, v in row.headers)
    return text.format(topic=row.topic, partition=row.partition, size=size)


# How long a task keeps what its start found in the ledger: a wheel batch fired again after a
# crash comes in the wheel's first batches.
DONE_KEPT_S = 600.0
# Ledger rows per ledger record at most: a task's rows acknowledged together travel as one
# Arrow IPC stream (LEDGER), so the ledger topic and query carry a record per send cycle, not per
# message, and the query decodes them a column at a time (JSON parsed in Spark cost the 2-core
# host about 60 µs of JVM CPU per row and put p99 lateness at 8.2 s at 5,000 msg/s).
LEDGER_BATCH = 2000
# A probe record's header (`_probe`): not ledger rows.
PROBE = "DELAYQ_PROBE"


def ledger_schema():
    import pyarrow as pa
    return pa.schema([
        ("uniq_key", pa.string()), ("topic", pa.string()), ("partition", pa.int32()),
        ("level", pa.int32()), ("ipart", pa.int32()), ("ioff", pa.int64()),
        ("append_ms", pa.int64()), ("due_ms", pa.int64()), ("sent_ms", pa.int64()),
        ("ready_offset", pa.int64()), ("status", pa.string()), ("reason", pa.string()),
        ("key", pa.binary()), ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))])


def ledger_row(row: Row, sent_ms: int, status: str = "delivered",
               reason: str | None = None) -> dict:
    """The ledger row of a sent row (`ledger_schema`); a dead letter's carries the message for
    the dead-letter table."""
    record = {"uniq_key": row.uniq_key, "topic": row.topic, "partition": row.partition,
              "level": row.level, "ipart": row.ipart, "ioff": row.ioff,
              "append_ms": row.append_ms, "due_ms": row.due_ms, "sent_ms": sent_ms,
              "ready_offset": row.offset, "status": status, "reason": reason}
    if status == "dead":
        record.update(key=row.key, value=row.value,
                      headers=[{"key": k, "value": v} for k, v in row.headers])
    return record


def ledger_record(rows: list[dict]) -> bytes:
    """Ledger rows as one Arrow IPC stream."""
    import pyarrow as pa

    schema = ledger_schema()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(pa.Table.from_pylist(rows, schema=schema))
    return sink.getvalue().to_pybytes()


def ledger_rows(record: bytes):
    """The rows of a ledger record, as an Arrow table."""
    import pyarrow as pa
    return pa.ipc.open_stream(pa.py_buffer(record)).read_all()


def dead_letter_headers(row: Row, reason: str) -> list:
    extra = [(H.REAL_TOPIC, row.topic.encode())]
    if row.partition is not None:
        extra.append((H.REAL_QID, str(row.partition).encode()))
    return row.headers + extra + [(H.DLQ_REASON, reason.encode())]


def run_partition(config: DispatchConfig, partition: int,
                  clock: Callable[[], float] = time.time) -> Iterator[dict]:
    """The task's whole life: dispatch `partition` until its stop record for this run, then
    yield what it did ({"partition", "sent", "dead", "skipped"}). Raises on a failure that a
    new task must take over (the supervisor starts it again from the committed offset)."""
    task = _Task(config, partition, clock)
    try:
        task.run()
    finally:
        task.close()
    yield {"partition": partition, "sent": task.sent, "dead": task.dead, "skipped": task.skipped}


def retrying(call: Callable[[], object], timeout_s: float = 120.0, pause_s: float = 1.0):
    """`call()`, again after a pause while it raises a transient Kafka error (a coordinator
    still loading, a broker restarting) and `timeout_s` has not passed."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except KafkaException as e:
            if not transient(e.args[0] if e.args else None) or time.monotonic() > deadline:
                raise
            log.info("dispatch: %s; retrying", e)
            time.sleep(pause_s)


def transient(err) -> bool:
    """A Kafka error that passes by itself (retriable, or a cluster still starting)."""
    from confluent_kafka import KafkaError as E

    if err is None or not hasattr(err, "code"):
        return False
    return err.retriable() or err.code() in {
        E.NOT_COORDINATOR, E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_NOT_AVAILABLE,
        E._TIMED_OUT, E._TRANSPORT, E._ALL_BROKERS_DOWN, E.LEADER_NOT_AVAILABLE,
        E.NOT_LEADER_FOR_PARTITION, E.REQUEST_TIMED_OUT}


class _Task:
    """One run of a dispatch task over its ready partition (see `run_partition`)."""

    def __init__(self, config: DispatchConfig, partition: int, clock: Callable[[], float]):
        from confluent_kafka import Consumer, Producer, TopicPartition

        self.config, self.partition, self.clock = config, partition, clock
        self.ready = TopicPartition(config.ready_topic, partition)
        self.ledger = TopicPartition(config.ledger_topic, partition)
        self.consumer = Consumer({**config.consumer, "enable.auto.commit": False,
                                  "auto.offset.reset": "error"})
        self.producer = Producer(config.producer)
        self.skew = Skew(clock=clock)
        self.heap: list[tuple] = []     # Row.order() of each held row
        self.retry: list[tuple[float, Callable[[], bool]]] = []   # (monotonic time, send)
        self.ledger_end = 0
        self.sent = self.dead = self.skipped = 0
        self.stopping = self.paused = False
        self.offsets = Offsets(0)
        self._last_ack = 0.0
        self._unledgered: list[tuple[Row, dict]] = []   # acknowledged, ledger row not yet sent

    # ---- start: where to read from, and what the ledger already holds ----------------------
    def _committed(self) -> tuple[int, int | None]:
        from confluent_kafka import TopicPartition

        [got] = self.consumer.committed([TopicPartition(self.ready.topic, self.partition)],
                                        timeout=60)
        if got.offset < 0:
            low, _ = self.consumer.get_watermark_offsets(self.ready, timeout=60)
            return low, None
        mark = json.loads(got.metadata).get("ledger") if got.metadata else None
        return got.offset, mark

    def _in_ledger(self, mark: int | None) -> set[int]:
        """The messages (`identity`) this partition's ledger holds from `replay_window_s`
        before the last commit's ledger mark to its end (from its beginning when nothing was
        committed yet: the partition holds only this ready partition's rows): those a crashed
        task delivered after its last commit, and those of a wheel batch that a crash makes
        the wheel fire again (it ran within the window before the crash). Sets `ledger_end`
        to the partition's end."""
        from confluent_kafka import TopicPartition

        low, high = self.consumer.get_watermark_offsets(self.ledger, timeout=60)
        self.ledger_end = high
        position = low if mark is None else self._before(max(low, min(mark, high) - 1), low)
        done: set[int] = set()
        if position >= high:
            return done
        self.consumer.assign([TopicPartition(self.ledger.topic, self.partition, position)])
        deadline = time.monotonic() + 120
        while position < high and time.monotonic() < deadline:
            for msg in self.consumer.consume(1000, timeout=1.0):
                if msg.error():
                    continue
                position = msg.offset() + 1
                if msg.headers():   # a probe
                    continue
                rows = ledger_rows(msg.value())
                for key, due in zip(rows.column("uniq_key").to_pylist(),
                                    rows.column("due_ms").to_pylist()):
                    done.add(identity(key, due))
        self.consumer.unassign()
        return done

    def _before(self, offset: int, low: int) -> int:
        """The ledger offset `replay_window_s` before the record at `offset`."""
        from confluent_kafka import TopicPartition

        self.consumer.assign([TopicPartition(self.ledger.topic, self.partition, offset)])
        msgs = self.consumer.consume(1, timeout=10.0)
        self.consumer.unassign()
        if not msgs or msgs[0].error():
            return low
        stamp = msgs[0].timestamp()[1] - int(self.config.replay_window_s * 1000)
        [found] = self.consumer.offsets_for_times(
            [TopicPartition(self.ledger.topic, self.partition, stamp)], timeout=30)
        return found.offset if found.offset >= 0 else offset

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        from confluent_kafka import TopicPartition

        start, mark = retrying(self._committed)
        done = retrying(lambda: self._in_ledger(mark))
        self.offsets = Offsets(start)
        self._probe(wait=True)
        self.consumer.assign([TopicPartition(self.ready.topic, self.partition, start)])
        last_commit = began = time.monotonic()
        while not self.stopping:
            if done and time.monotonic() - began > DONE_KEPT_S:
                done = set()
            self._release()
            self._send_due()
            self.producer.poll(0)
            self._ledger()
            self._pace()
            for msg in self.consumer.consume(5000, timeout=self._wait_s()):
                if msg.error():   # the client's own report; it reconnects and goes on
                    if msg.error().fatal():
                        from confluent_kafka import KafkaException
                        raise KafkaException(msg.error())
                    log.warning("dispatch %d: %s", self.partition, msg.error())
                    continue
                self._take(msg, done)
            if time.monotonic() - last_commit >= self.config.commit_interval_s:
                self._commit()
                last_commit = time.monotonic()
            if time.monotonic() - self._last_ack > self.config.probe_interval_s:
                self._probe()
        # A clean stop: what was handed to the producer is acknowledged (and its ledger row
        # with it) before the commit, so the next run skips it; rows not yet due stay above
        # the commit point and are read again.
        for _ in range(3):
            self.producer.flush(30)
            self._ledger()
            self._release(force=True)
        self._commit()

    def close(self) -> None:
        try:
            self.consumer.close()
        finally:
            self.producer.flush(10)

    def _now_ms(self) -> int:
        """This host's clock held back by how far it may run ahead of the broker's."""
        return int(self.clock() * 1000 - self.skew.ahead_ms())

    def _wait_s(self) -> float:
        if not self.heap:
            return 0.02
        return min(0.02, max(0.0, (self.heap[0][0] - self._now_ms()) / 1000))

    def _pace(self) -> None:
        """Bounded memory: stop reading while too many rows are held."""
        held = len(self.heap)
        if not self.paused and held >= self.config.max_held:
            self.consumer.pause([self.ready])
            self.paused = True
        elif self.paused and held < self.config.max_held // 2:
            self.consumer.resume([self.ready])
            self.paused = False

    def _take(self, msg, done: set[int]) -> None:
        """One ready record: the run's stop, a message the ledger holds already (skipped), or
        a row to hold until due."""
        offset, headers = msg.offset(), msg.headers() or []
        if headers and headers[-1][0] == READY_STOP:
            self.offsets.skip(offset)
            if (msg.value() or b"").decode() == self.config.run_id:
                self.stopping = True
            return
        row = ready_row(offset, msg.key(), msg.value(), headers)
        if done and identity(row.uniq_key, row.due_ms) in done:
            self.offsets.skip(offset)
            self.skipped += 1
            return
        self.offsets.read(offset, self.ledger_end)
        heapq.heappush(self.heap, row.order())

    def _send_due(self) -> None:
        now = self._now_ms()
        while self.heap and self.heap[0][0] <= now:
            row = heapq.heappop(self.heap)[-1]
            if not self._produce(row.topic, row.partition, row, row.headers, self._delivered):
                heapq.heappush(self.heap, row.order())   # the producer's queue is full: later
                return

    def _produce(self, topic: str, partition: int | None, row: Row, headers, callback) -> bool:
        from confluent_kafka import KafkaException

        sent_ms = self._now_ms()
        kwargs = {} if partition is None else {"partition": partition}
        try:
            self.producer.produce(topic, value=row.value, key=row.key, headers=headers,
                                  on_delivery=lambda err, msg: callback(err, msg, row, sent_ms),
                                  **kwargs)
        except BufferError:
            self.producer.poll(0.05)
            return False
        except KafkaException as e:   # refused before it was queued (e.g. no such partition)
            callback(e.args[0], None, row, sent_ms)
        return True

    # ---- acknowledgements (called from producer.poll) ---------------------------------------
    def _delivered(self, err, msg, row: Row, sent_ms: int) -> None:
        if err is None:
            self.sent += 1
            self._unledgered.append((row, ledger_row(row, sent_ms)))
            return
        reason = refusal(err, row)
        if reason is None:
            log.warning("dispatch %d: sending %s to %s failed (%s); retrying", self.partition,
                        row.uniq_key, row.topic, err)
            self._later(lambda: self._produce(row.topic, row.partition, row, row.headers,
                                              self._delivered))
            return
        self._dead_letter(row, reason)

    def _dead_letter(self, row: Row, reason: str) -> bool:
        sent = self._produce(self.config.dlq_topic, None, row, dead_letter_headers(row, reason),
                             lambda e, m, r, s: self._dead_lettered(e, r, s, reason))
        if not sent:
            self._later(lambda: self._dead_letter(row, reason), 0.05)
        return True

    def _dead_lettered(self, err, row: Row, sent_ms: int, reason: str) -> None:
        if err is not None:
            self._later(lambda: self._dead_letter(row, reason))
            return
        self.dead += 1
        self._unledgered.append((row, ledger_row(row, sent_ms, "dead", reason)))

    def _ledger(self) -> None:
        """The ledger rows of what was acknowledged since the last call, as records of up to
        LEDGER_BATCH rows; their rows are done once the ledger has them."""
        while self._unledgered:
            chunk, self._unledgered = (self._unledgered[:LEDGER_BATCH],
                                       self._unledgered[LEDGER_BATCH:])
            rows = [row for row, _ in chunk]
            record = ledger_record([entry for _, entry in chunk])

            def send(record=record, rows=rows) -> bool:
                try:
                    self.producer.produce(
                        self.ledger.topic, value=record, partition=self.partition,
                        on_delivery=lambda err, msg: self._ledgered(err, msg, rows, send))
                except BufferError:
                    return False
                return True
            if not send():
                self._later(send, 0.05)

    def _ledgered(self, err, msg, rows: list[Row], send) -> None:
        if err is not None:
            self._later(send)
            return
        self.ledger_end = max(self.ledger_end, msg.offset() + 1)
        kind, stamp = msg.timestamp()
        if kind == 2:   # TIMESTAMP_LOG_APPEND_TIME: the broker's clock
            self.skew.observe(stamp)
        self._last_ack = time.monotonic()
        for row in rows:
            self.offsets.done(row.offset)

    def _probe(self, wait: bool = False) -> None:
        """A record on the ledger partition whose acknowledgement measures the clock (Skew);
        the ledger query ignores it. At the start, nothing is sent before it is measured."""
        self._last_ack = time.monotonic()

        def send():
            self.producer.produce(self.ledger.topic, value=b"", headers=[(PROBE, b"1")],
                                  partition=self.partition,
                                  on_delivery=lambda err, msg: self._ledgered(err, msg, [], send))
        send()
        deadline = time.monotonic() + 60
        while wait and not self.skew.measured and time.monotonic() < deadline:
            self.producer.poll(0.05)
            self._release()

    def _later(self, send: Callable[[], bool], delay_s: float | None = None) -> None:
        """Call `send` again after a back-off (the retry's, or `delay_s`); a send that returns
        False (the producer's queue was full) is put back the same way."""
        self.retry.append((time.monotonic() + (delay_s if delay_s is not None
                                               else self.config.retry_backoff_s), send))

    def _release(self, force: bool = False) -> None:
        if not self.retry:
            return
        now = time.monotonic()
        due = [send for at, send in self.retry if force or at <= now]
        self.retry = [(at, send) for at, send in self.retry if not (force or at <= now)]
        for send in due:
            if send() is False:
                self._later(send, 0.05)

    def _commit(self) -> None:
        """Commit the commit point; a transient failure waits for the next commit."""
        from confluent_kafka import KafkaException, TopicPartition

        point, mark = self.offsets.commit_point(self.ledger_end)
        try:
            self.consumer.commit(offsets=[TopicPartition(
                self.ready.topic, self.partition, point, metadata=json.dumps({"ledger": mark}))],
                asynchronous=False)
        except KafkaException as e:
            if not transient(e.args[0] if e.args else None):
                raise
            log.warning("dispatch %d: commit failed (%s); the next one retries it",
                        self.partition, e)
