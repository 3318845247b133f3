"""The ledger's records: the rows a dispatch task sends to its ledger partition for what it
delivered or dead-lettered, a few thousand to a record, as one Arrow IPC stream each."""
from __future__ import annotations

import os
import socket
from operator import attrgetter

import pyarrow as pa

from state.columns import HEADERS
from streaming.dispatch.rules import Row, message_bytes


# A probe record's header (`_probe`): an empty record, not ledger rows.
PROBE = "DELAYQ_PROBE"
# A ledger record's header: the process that sent its rows (`sender`).
SENDER = "DELAYQ_SENDER"


def sender() -> bytes:
    """Who sends: host, pid and working folder of this Python worker (on a standalone cluster
    the executor's folder, `<work>/app-…/<executor id>`; on Kubernetes the host is its pod)."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.getcwd()}".encode()


def ledger_schema():
    return pa.schema([
        ("uniq_key", pa.string()), ("topic", pa.string()), ("partition", pa.int32()),
        ("level", pa.int32()), ("ipart", pa.int32()), ("ioff", pa.int64()),
        ("append_ms", pa.int64()), ("due_ms", pa.int64()), ("sent_ms", pa.int64()),
        ("ready_offset", pa.int64()), ("status", pa.string()), ("reason", pa.string()),
        ("key", pa.binary()), ("value", pa.binary()),
        ("headers", HEADERS), ("offset", pa.int64()),
        # A row read from the ring (streaming/dispatch/ring.py): where (else null).
        ("ring_partition", pa.int32()), ("ring_offset", pa.int64()),
        # A row the cold tier rolled onto the intake (the wheel counted it received).
        ("rolled", pa.bool_())])


# Bytes, with room, of a ledger row besides its strings and message (fixed columns, offsets,
# validity) and of a record besides its rows (Arrow schema and padding, Kafka framing, SENDER).
_LEDGER_ROW_BYTES = 128
_LEDGER_RECORD_BYTES = 8192


def ledger_chunks(acked: list[tuple], most_rows: int, most_bytes: int,
                  ring_topic: str | None = None):
    """`acked` (row, sent_ms, reason or None, landed (partition, offset) or None) as (rows,
    record) pairs of at most `most_rows` rows and `most_bytes` bytes, in order. A dead letter's
    row carries its message unless it could not fit a record alone (the DLQ topic has it); a
    row whose source is `ring_topic` says where in it."""
    room = most_bytes - _LEDGER_RECORD_BYTES
    chunk: list = []
    size = 0
    for row, sent_ms, reason, landed in acked:
        cost = _LEDGER_ROW_BYTES + sum(len(text.encode()) for text in (
            row.uniq_key, row.topic or "", reason or ""))
        whole = False
        if reason is not None:
            message = message_bytes(row) + 8 * len(row.headers)   # and each header's offsets
            whole = cost + message <= room
            cost += message if whole else 0
        if chunk and (len(chunk) >= most_rows or size + cost > room):
            yield [r for r, *_ in chunk], ledger_record(chunk, ring_topic)
            chunk, size = [], 0
        chunk.append((row, sent_ms, reason, landed, whole))
        size += cost
    if chunk:
        yield [r for r, *_ in chunk], ledger_record(chunk, ring_topic)


def ledger_record(sent: list[tuple[Row, int, str | None, tuple | None, bool]],
                  ring_topic: str | None = None) -> bytes:
    """One Arrow IPC stream of ledger rows (`ledger_schema`) from (row, sent_ms, reason, landed,
    with its message) tuples, built a column at a time."""
    rows, sent_ms, reasons, landed, wholes = (list(column) for column in zip(*sent))
    dead = [row if whole else None for row, whole in zip(rows, wholes)]
    columns = {name: list(map(attrgetter(name), rows)) for name in (
        "uniq_key", "topic", "level", "ipart", "ioff", "append_ms", "due_ms")}
    columns.update({
        "partition": [at[0] if at else r.partition for r, at in zip(rows, landed)],
        "offset": [at[1] if at else None for at in landed],
        "sent_ms": sent_ms,
        "ready_offset": [r.offset if r.source is None else None for r in rows],
        "status": [r.status or ("delivered" if reason is None else "dead")
                   for r, reason in zip(rows, reasons)],
        "reason": reasons,
        "key": [r.key if r else None for r in dead],
        "value": [r.value if r else None for r in dead],
        "headers": [[{"key": k, "value": v} for k, v in r.headers] if r else None for r in dead]})
    ring = [r.source is not None and r.source[0] == ring_topic for r in rows]
    columns.update(ring_partition=[r.source[1] if on else None for r, on in zip(rows, ring)],
                   ring_offset=[r.offset if on else None for r, on in zip(rows, ring)],
                   rolled=[r.rolled for r in rows])
    schema = ledger_schema()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(pa.Table.from_pydict(columns, schema=schema))
    return sink.getvalue().to_pybytes()


def ledger_rows(record: bytes):
    """The rows of a ledger record, as an Arrow table of `ledger_schema`: a record written
    before a column was added reads it as null."""
    table = pa.ipc.open_stream(pa.py_buffer(record)).read_all()
    schema = ledger_schema()
    if table.schema.names != schema.names:
        table = pa.table({f.name: table.column(f.name) if f.name in table.schema.names
                          else pa.nulls(table.num_rows, f.type) for f in schema}, schema=schema)
    return table
