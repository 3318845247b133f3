"""The wheel function, driven through PySpark's own GroupState class (pure Python, no JVM)."""
import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from state.columns import ENVELOPE, OUTPUT
from state.envelope import Rules
from state.parse import parse_frame
from state.wheel import BUCKET_DEAD, BUCKET_NOW, WheelConfig, decode, make_wheel
from pyspark.sql.pandas.types import _create_converter_from_pandas

from streaming.schema import OUTPUT_SPARK, STATE_SPARK

NOW = 1_700_000_000_000
RULES = Rules((1_000, 2_000, 3_000), "in", "in.DLQ")
CONFIG = WheelConfig((1_000, 2_000, 3_000), slot_ms=1_000, lead_ms=500,
                     watermark_delay_ms=10_000, dlq_topic="in.DLQ")


def intake(*rows):
    """rows: (headers, offset) → an intake frame, appended at NOW."""
    return pd.DataFrame({
        "key": [b"k"] * len(rows), "value": [f"v{o}".encode() for _, o in rows],
        "ipart": [0] * len(rows), "ioff": [o for _, o in rows],
        "append_ms": [NOW] * len(rows),
        "headers": [[{"key": k, "value": v} for k, v in h] for h, _ in rows],
    })


def state(watermark_ms, value=None, timed_out=False):
    return GroupState(
        optionalValue=value, batchProcessingTimeMs=NOW, eventTimeWatermarkMs=watermark_ms,
        timeoutConf=GroupStateTimeout.EventTimeTimeout, hasTimedOut=timed_out,
        watermarkPresent=True, defined=value is not None, updated=False, removed=False,
        timeoutTimestamp=-1, keyAsUnsafe=b"", valueSchema=STATE_SPARK)


def run(frame, st, clock_ms=NOW):
    wheel = make_wheel(CONFIG, clock=lambda: clock_ms / 1000)
    key = (int(frame["bucket"].iloc[0]), int(frame["slot"].iloc[0])) if len(frame) else (2, 0)
    out = list(wheel(key, iter([frame] if len(frame) else []), st))
    for part in out:  # what PySpark's worker does with each frame: convert every column
        for field in OUTPUT_SPARK.fields:
            _create_converter_from_pandas(field.dataType, timezone="UTC")(part[field.name])
    rows = pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=["kind"])
    run.tally = rows[rows["kind"] == "tally"]
    return rows[rows["kind"] != "tally"].reset_index(drop=True)


def envelopes(*rows):
    return parse_frame(intake(*rows), RULES, 1_000, 2, NOW)


def test_delayed_messages_wait_in_state_with_a_timer_lead_before_due():
    frame = envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"2"), ("UNIQ_KEY", b"a")], 1))
    st = state(watermark_ms=NOW - 10_000)   # real watermark == NOW
    out = run(frame, st)
    assert out.empty, "due in 2 s, lead 0.5 s: nothing fires yet"
    assert list(zip(run.tally["level"], run.tally["received"], run.tally["pending_delta"])) == [(2, 1, 1)]
    assert st.exists
    blob, count, earliest = st.get
    assert (count, earliest) == (1, NOW + 2_000)
    assert decode(blob).num_rows == 1
    # The Spark timer is in Spark's watermark units (real time minus the watermark delay).
    assert st._timeout_timestamp == NOW + 2_000 - 500 - 10_000


def test_timeout_releases_messages_due_before_the_horizon_with_delivery_headers():
    frame = envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"2"), ("UNIQ_KEY", b"a"), ("u", b"1")], 1))
    st = state(NOW - 10_000)
    run(frame, st)
    value = st.get
    fired = state(NOW + 1_600 - 10_000, value=value, timed_out=True)
    out = run(pd.DataFrame(columns=ENVELOPE.names), fired, clock_ms=NOW + 1_600)
    assert list(out["kind"]) == ["deliver"]
    row = out.iloc[0]
    assert (row["topic"], row["due_ms"], row["uniq_key"]) == ("t", NOW + 2_000, "a")
    assert [h["key"] for h in row["headers"]] == ["u", "UNIQ_KEY", "DELIVER_MS"]
    assert row["headers"][-1]["value"] == str(NOW + 2_000).encode()
    assert fired._removed
    assert list(run.tally["pending_delta"]) == [-1]


def test_messages_beyond_the_horizon_stay_with_a_new_timer():
    frame = envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"1"), ("UNIQ_KEY", b"a")], 1),
                      ([("REAL_TOPIC", b"t"), ("DELAY", b"3"), ("UNIQ_KEY", b"b")], 2))
    frame["bucket"], frame["slot"] = 9, 0  # same group for the test
    st = state(NOW + 600 - 10_000)
    out = run(frame, st, clock_ms=NOW + 600)
    assert list(out["uniq_key"]) == ["a"]
    assert st.get[1:] == (1, NOW + 3_000)


def test_immediate_and_dead_pass_through_without_state():
    frame = envelopes(([("REAL_TOPIC", b"t"), ("UNIQ_KEY", b"now")], 1),
                      ([("DELAY", b"1")], 2), ([("DELAYQ_HEARTBEAT", b"1")], 3))
    for bucket in (BUCKET_NOW, BUCKET_DEAD):
        part = frame[frame["bucket"] == bucket]
        st = state(NOW - 10_000)
        out = run(part, st)
        assert not st.exists
        if bucket == BUCKET_NOW:
            assert list(out["kind"]) == ["deliver"], "heartbeats are dropped"
            assert list(zip(run.tally["level"], run.tally["received"])) == [(0, 1)]
        else:
            assert list(out["kind"]) == ["dead"]
            assert out.iloc[0]["topic"] == "in.DLQ"
            assert out.iloc[0]["headers"][-1] == {"key": "DLQ_REASON",
                                                  "value": b"header REAL_TOPIC is missing"}
            assert out.iloc[0]["headers"][0]["key"] == "DELAY", "original headers kept"


def test_cancel_drops_a_pending_message_and_reports_unknown_ones():
    frame = envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"2"), ("UNIQ_KEY", b"a")], 1),
                      ([("REAL_TOPIC", b"t"), ("DELAY", b"2"), ("UNIQ_KEY", b"b")], 2),
                      ([("TIMER_DEL_UNIQKEY", b"a"), ("DELAY", b"2")], 3),
                      ([("TIMER_DEL_UNIQKEY", b"zzz"), ("DELAY", b"2")], 4))
    frame["bucket"], frame["slot"] = 2, 0
    st = state(NOW - 10_000)
    out = run(frame, st)
    assert sorted(zip(out["kind"], out["uniq_key"])) == [("cancel_unknown", "zzz"),
                                                        ("cancelled", "a")]
    assert decode(st.get[0]).column("uniq_key").to_pylist() == ["b"]
