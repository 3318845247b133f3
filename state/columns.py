"""Column layouts shared by the parse stage, the wheel and the sinks (Arrow types, no Spark).

`streaming/wheel/schema.py` turns these into Spark schemas, so the two can never drift apart.
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

# The wheel's input: an ENVELOPE without the message's body. The wheel query hands its parse
# only each record's position, append time and control headers (streaming/wheel/query.py), so
# no key, value or user header reaches the wheel's Python; the dispatch tasks read the bodies
# back from the intake when the message is due (streaming/dispatch/bodies.py).
BODY = ("key", "value", "hkeys", "hvals")
INDEX_ENVELOPE = pa.schema([field for field in ENVELOPE if field.name not in BODY])

# A wheel group's state (applyInPandasWithState keeps it as one row): how many references it
# holds, the earliest due time among them, and the references, REFERENCE's columns as lists in
# one JSON object. Not as array columns: PySpark 4.2.0's worker lowercases the state schema's
# JSON it receives (`Conf.get` lowercases every value unless told not to), and an array's
# "elementType" key no longer parses. No binary column either: Spark's pickler copies binary
# byte by byte. Spark SQL reads the JSON with from_json (streaming/wheel/query.py wheel_state).
REFERENCE = pa.schema([ENVELOPE.field(name) for name in (
    "ipart", "ioff", "append_ms", "due_ms", "uniq_key")])
STATE = pa.schema([("count", pa.int32()), ("earliest_ms", pa.int64()), ("refs", pa.string())])
# The type of STATE's `refs`, for Spark SQL's from_json.
_SQL = {pa.int32(): "int", pa.int64(): "bigint", pa.string(): "string"}
REFS_DDL = ", ".join(f"{f.name} array<{_SQL[f.type]}>" for f in REFERENCE)

# What the wheel emits, per batch: references to fire, dead letters, cold parks and cancel
# outcomes. A row names its intake record (ipart, ioff, append_ms); the job reads the record
# back in the JVM where a body is needed there (a dead letter, a cold park: `sinks/kafka.py`
# intake_bodies), and the dispatch tasks read it back for a delivery.
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
    # tally rows only (one per wheel call and level): messages taken in, and the change of
    # the group's pending count; they feed the metrics and never leave the job.
    ("received", pa.int32()),
    ("pending_delta", pa.int32()),
])

# A wheel row with its intake record read back (`sinks/kafka.py` intake_bodies): a dead letter
# or a cold park. The record's key, value and headers as they came (null: no longer there).
WITH_BODY = pa.schema([*WHEEL_OUT, ("key", pa.binary()), ("value", pa.binary()),
                       ("headers", HEADERS)])

# Bumped whenever the wheel's state (STATE) or its operator change: a checkpoint holding
# another format is refused. 6: applyInPandasWithState over references (5 was
# transformWithState's state of whole messages).
STATE_FORMAT = 6
