"""Column layouts shared by the parse stage, the wheel and the sinks (Arrow types, no Spark).

`streaming/schema.py` turns these into Spark schemas, so the two can never drift apart.
"""
from __future__ import annotations

import pyarrow as pa

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
# Inside the parse stage and the wheel, headers travel as two parallel lists (names, values):
# a list of structs costs PySpark a Python dict per header on every pandas conversion, a list
# of strings or bytes does not. The job zips them back into HEADERS after the wheel.
HEADER_KEYS = pa.list_(pa.string())
HEADER_VALUES = pa.list_(pa.binary())

# One parsed intake record (output of the parse stage, input of the wheel).
ENVELOPE = pa.schema([
    ("kind", pa.string()),
    ("bucket", pa.int32()),      # wheel group: level, TIMER bucket, or a pass-through bucket
    ("slot", pa.int64()),        # wheel group: due slot (or a spreading number)
    ("level", pa.int32()),
    ("due_ms", pa.int64()),
    ("uniq_key", pa.string()),
    ("topic", pa.string()),
    ("qid", pa.int32()),
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("hkeys", HEADER_KEYS),      # user headers; for dead letters, the original headers
    ("hvals", HEADER_VALUES),
    ("reason", pa.string()),
    ("cancel_key", pa.string()),
    ("rolled", pa.bool_()),
    ("append_ms", pa.int64()),
    ("ipart", pa.int32()),
    ("ioff", pa.int64()),
])

# A pending message inside a chunk of a wheel group's state: these ENVELOPE columns.
PENDING = pa.schema([ENVELOPE.field(name) for name in (
    "due_ms", "uniq_key", "topic", "qid", "key", "value", "hkeys", "hvals", "level", "append_ms",
    "ipart", "ioff")])

# What the job emits, per batch: deliveries, dead letters and cancel outcomes.
OUTPUT = pa.schema([
    ("kind", pa.string()),       # deliver | dead | cold | cancelled | cancel_unknown | tally
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("headers", HEADERS),        # exactly the headers written to Kafka
    ("uniq_key", pa.string()),
    ("level", pa.int32()),
    ("due_ms", pa.int64()),
    ("append_ms", pa.int64()),
    ("ipart", pa.int32()),
    ("ioff", pa.int64()),
    ("reason", pa.string()),
    # tally rows only (one per wheel call and level): messages taken in, and the change of
    # the group's pending count; they feed the metrics and never leave the job.
    ("received", pa.int32()),
    ("pending_delta", pa.int32()),
])

# What the wheel's processor returns: OUTPUT with the message's own headers as two lists. The job
# builds OUTPUT's `headers` from them in Spark, adding UNIQ_KEY and DELIVER_MS to deliveries and
# DLQ_REASON to dead letters (streaming/wheel_query.py, `with_kafka_headers`).
WHEEL_OUT = pa.schema([
    field for name in OUTPUT.names
    for field in ([ENVELOPE.field("hkeys"), ENVELOPE.field("hvals")] if name == "headers"
                  else [OUTPUT.field(name)])
])

# Bumped whenever the wheel's state (state/processor.py) or PENDING change: a checkpoint
# holding another format is refused. 5: transformWithState's layout only (4 was either
# operator's, and a stamp of format 4 does not always say which).
STATE_FORMAT = 5
