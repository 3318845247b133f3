"""Column layouts shared by the parse stage, the wheel and the sinks (Arrow types, no Spark);
`streaming/wheel/schema.py` turns them into Spark schemas, so the two never drift apart."""
from __future__ import annotations

import pyarrow as pa

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

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
    # User headers (a dead letter's: all its headers) as parallel (names, values) lists: a list
    # of structs costs PySpark a Python dict per header per pandas conversion.
    ("hkeys", pa.list_(pa.string())),
    ("hvals", pa.list_(pa.binary())),
    ("reason", pa.string()),
    ("cancel_key", pa.string()),
    ("rolled", pa.bool_()),
    ("append_ms", pa.int64()),
    ("ipart", pa.int32()),
    ("ioff", pa.int64()),
])

# The wheel's input: no body reaches the wheel's Python; the dispatch tasks read bodies back
# from the intake when due (streaming/dispatch/bodies.py).
BODY = ("key", "value", "hkeys", "hvals")
INDEX_ENVELOPE = pa.schema([field for field in ENVELOPE if field.name not in BODY])

# A wheel group's state, one row: count, earliest due time, and REFERENCE's columns as lists in
# one JSON object. Not array columns: PySpark 4.2.0's worker lowercases the state schema's JSON,
# breaking "elementType". No binary either: Spark's pickler copies binary byte by byte.
REFERENCE = pa.schema([ENVELOPE.field(name) for name in (
    "ipart", "ioff", "append_ms", "due_ms", "uniq_key")])
STATE = pa.schema([("count", pa.int32()), ("earliest_ms", pa.int64()), ("refs", pa.string())])
# The type of STATE's `refs`, for Spark SQL's from_json.
_SQL = {pa.int32(): "int", pa.int64(): "bigint", pa.string(): "string"}
REFS_DDL = ", ".join(f"{f.name} array<{_SQL[f.type]}>" for f in REFERENCE)

# What the wheel emits per batch. A row names its intake record (ipart, ioff, append_ms); bodies
# are read back in the JVM where needed (`sinks/kafka.py` intake_bodies) or by the dispatch tasks.
WHEEL_OUT = pa.schema([
    ("kind", pa.string()),       # deliver | dead | cold | cancelled | cancel_unknown | tally
    ("topic", pa.string()),      # a cold or dead row's REAL_TOPIC (a dead letter's: the DLQ)
    ("partition", pa.int32()),   # a cold row's REAL_QID
    ("uniq_key", pa.string()),
    ("level", pa.int32()),
    ("due_ms", pa.int64()),
    ("append_ms", pa.int64()),
    ("ipart", pa.int32()),
    ("ioff", pa.int64()),
    ("reason", pa.string()),
    # tally rows only (per wheel call and level), for the metrics: taken in, pending change
    ("received", pa.int32()),
    ("pending_delta", pa.int32()),
])

# A wheel row with its intake record read back (a dead letter or a cold park); null: gone.
WITH_BODY = pa.schema([*WHEEL_OUT, ("key", pa.binary()), ("value", pa.binary()),
                       ("headers", HEADERS)])

# The cold tier's column that marks a cancel (sinks/cold.py): null on a message, a cancel's state.
TOMBSTONE = "tombstone"
# Bumped whenever STATE or the wheel's operator change: a checkpoint of another format is refused.
STATE_FORMAT = 6
