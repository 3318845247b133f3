"""The dispatch stage's rules and records (its loop: streaming/dispatch/task.py). A task sends
each held row at its due time, never before, then its ledger row, and commits only below the
lowest row not yet done; a restart skips what the ledger holds (`Offsets`) and a refired wheel
batch's copies (`Refired`). No Spark import: the loop runs in a plain Python worker."""
from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException

from state import headers as H
from state.reasons import reason

# The stop record the driver writes to every ready partition; its value is the run's id.
READY_STOP = "DELAYQ_READY_STOP"


@dataclass(frozen=True)
class DispatchConfig:
    """What one dispatch task needs, pickled to the executor."""

    consumer: dict          # librdkafka settings (bootstrap, security, group.id)
    producer: dict          # librdkafka settings of the real-topic and ledger producer
    ready_topic: str
    ledger_topic: str
    dlq_topic: str
    run_id: str
    # conf/defaults.toml's dispatch_* settings (streaming/stages.py dispatch_config)
    commit_interval_s: float
    max_held: int                     # rows held before consumption pauses
    gather_s: float                   # intake records parsed, ledger rows sent, this often
    urgent_gather_s: float            # ... and this often when one may be due soon
    retry_backoff_s: float            # a transient send failure is retried this much later
    probe_interval_s: float           # an idle task measures its clock against the broker's
    ledger_batch: int                 # ledger rows per ledger record at most
    read_batch: int                   # records read and parsed per turn of the loop at most
    ledger_bytes: int                 # a ledger record's bytes at most (`ledger_chunks`)
    clock_tolerance_ms: int           # a clock off the broker's by half of this is logged
    intake_refresh_s: float           # how often a task looks for new intake partitions
    skip_deadline_s: float            # the restart's skip reads its ledger this long at most
    ack_check_s: float                # records unacked this long: their topics looked up
    stall_s: float                    # the producer cut off this long: a new one (txn.py)
    # The intake read (direct.py): its rules, which levels (-1: none), the ready topic's partition
    # count (which intake partitions a task reads), where an uncommitted one starts (else earliest).
    intake_topic: str = ""
    rules: object = None
    direct_max_delay_ms: int = -1
    ready_partitions: int = 1
    intake_start: dict = field(default_factory=dict)
    # The read-back (bodies.py): a gap of more wanted records than this is seeked past, not read.
    fetch_gap: int = 500
    # exactly_once: the transactional.id's prefix (txn.py; the task adds its partition), offsets
    # committed every `offsets_interval_s`; empty: at least once, no transactions.
    transactional_id: str = ""
    offsets_interval_s: float = 1.0
    # The task's own timer wheel (ring.py RingConfig; None: no ring).
    ring: object = None
    # The JVM above the task's Python worker runs this much nicer (priority.py; 0: as it is).
    jvm_nice: int = 0


class Row:
    """A held message at `offset` in `source`: None for the ready partition, (intake topic,
    partition) for one read from the intake itself (direct.py). `body` False: a reference not yet
    read back (bodies.py), its topic, key, value and headers unknown. `status`: its ledger row's,
    when not delivered or dead (cancels.py); `cancel`: the cancel that dropped it, done with it;
    `rolled`: the cold tier rolled it onto the intake (the wheel counted it received)."""

    __slots__ = ("due_ms", "ipart", "ioff", "offset", "topic", "partition", "key", "value",
                 "headers", "level", "append_ms", "uniq_key", "source", "body", "status", "cancel",
                 "rolled")

    def __init__(self, due_ms, ipart, ioff, offset, topic, partition, key, value, headers,
                 level, append_ms, uniq_key, source=None, body=True):
        self.due_ms, self.ipart, self.ioff, self.offset = due_ms, ipart, ioff, offset
        self.topic, self.partition, self.key, self.value = topic, partition, key, value
        self.headers, self.level, self.append_ms = headers, level, append_ms
        self.uniq_key, self.source, self.body = uniq_key, source, body
        self.status = self.cancel = None
        self.rolled = False

    def order(self) -> tuple:
        """Its place in the heap: due time, then intake position (one key's order)."""
        return (self.due_ms, self.ipart, self.ioff, self.offset)


class Refired:
    """Copies of a wheel batch fired again (Spark's Kafka sink is at least once). A reference's
    key is its batch's id (sinks/ready.py); one seen before in the newest batch is a copy. The
    commit's metadata names that batch and its first offset, where a restart reads from."""

    def __init__(self, batch: int | None = None, start: int | None = None):
        self.batch, self.start = batch, start   # the newest batch, its first offset here
        self._seen: set[tuple[str, int]] = set()

    def copy(self, key: bytes, offset: int, row: "Row") -> bool:
        """Whether the reference `row` at `offset` (its record's `key`) is a copy."""
        batch = int(key)
        if batch != self.batch:   # the next batch (or a new checkpoint's, numbered again)
            self.batch, self.start, self._seen = batch, offset, set()
        known = row.uniq_key, row.due_ms   # a resend is due at another time: not a copy
        if known in self._seen:
            return True
        self._seen.add(known)
        return False


def ready_row(offset: int, value: bytes) -> Row:
    """A fired reference from its ready record's value (sinks/ready.py reference_value)."""
    due, level, ipart, ioff, append_ms, uniq = value.split(b",", 5)
    return Row(int(due), int(ipart), int(ioff), offset, None, None, None, None, [],
               int(level), int(append_ms), uniq.decode(), body=False)


class Offsets:
    """One source's open rows and its commit point: the lowest open row with the ledger's end
    when it was read (its and later rows' ledger rows lie past it), else the next offset and the
    ledger's end now. After a restart the mark stays at the start's (`floor`) until the point
    passes the last row an earlier run delivered (`earlier`): their ledger rows lie below."""

    def __init__(self, position: int, floor: int = 0, earlier: int = -1):
        self.position = position
        self._open: dict[int, int] = {}
        self._floor, self._earlier = floor, earlier

    def read(self, offset: int, ledger_end: int) -> None:
        self._open[offset] = ledger_end
        self.position = max(self.position, offset + 1)

    def skip(self, offset: int) -> None:
        self.position = max(self.position, offset + 1)

    def done(self, offset: int) -> None:
        self._open.pop(offset, None)

    def commit_point(self, ledger_end: int) -> tuple[int, int]:
        point = min(self._open, default=self.position)
        mark = self._open.get(point, ledger_end)
        return point, min(mark, self._floor) if point <= self._earlier else mark


def message_bytes(row: Row) -> int:
    return len(row.key or b"") + len(row.value or b"") + sum(
        len(k.encode()) + len(v or b"") for k, v in row.headers)


# Send failures that will not pass on a retry: the row is dead-lettered with the reason.
_UNKNOWN_TOPIC = ("unknown_topic", "REAL_TOPIC '{topic}' does not exist")
_TOO_LARGE = ("too_large", "message of {size} bytes is too large for topic '{topic}'")
# The broker's refusals of a record batch too large for the topic (`_Task._delivered`).
TOO_LARGE = (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE)
# A record the task's own abort or stall purged from its producer: no refusal of the record.
PURGED = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)
_PERMANENT = {
    KafkaError.UNKNOWN_TOPIC_OR_PART: _UNKNOWN_TOPIC, KafkaError._UNKNOWN_TOPIC: _UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION: ("partition_out_of_range",
                                    "REAL_QID {partition} is out of range for topic '{topic}'"),
    **dict.fromkeys(TOO_LARGE, _TOO_LARGE),
    KafkaError.TOPIC_AUTHORIZATION_FAILED: ("not_authorized",
                                            "not authorized to write to topic '{topic}'"),
    KafkaError.INVALID_RECORD: ("invalid_record", "topic '{topic}' refused the record as invalid"),
    KafkaError.TOPIC_EXCEPTION: ("illegal_topic", "REAL_TOPIC '{topic}' is not a valid topic")}


def refusal(err, row: Row) -> str | None:
    """The dead-letter reason of a permanent send failure; None for a transient one (retried).
    A fatal producer error is raised: the task restarts with a new producer."""
    if err.fatal():
        raise KafkaException(err)
    known = _PERMANENT.get(err.code())
    if known is None:
        return None
    label, text = known
    return reason(label, text.format(topic=row.topic, partition=row.partition,
                                     size=message_bytes(row)))


# A dead-lettered reference's header: the intake record it named ("<partition>-<offset>").
INTAKE_RECORD = "DELAYQ_INTAKE_RECORD"


def dead_letter_headers(row: Row, reason: str) -> list:
    """A refused row's headers, its real topic and partition back, then DLQ_REASON; bad input
    (no topic) keeps its headers as they came; a reference without its record names it."""
    if not row.body:
        return [(H.UNIQ_KEY, row.uniq_key.encode()), (H.DELIVER_MS, str(row.due_ms).encode()),
                (INTAKE_RECORD, f"{row.ipart}-{row.ioff}".encode()),
                (H.DLQ_REASON, reason.encode())]
    extra = [] if row.topic is None else [(H.REAL_TOPIC, row.topic.encode())]
    if row.partition is not None:
        extra.append((H.REAL_QID, str(row.partition).encode()))
    return row.headers + extra + [(H.DLQ_REASON, reason.encode())]
