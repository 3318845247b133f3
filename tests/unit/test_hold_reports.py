"""What the hold tasks report to the driver (sinks/kafka.py HoldReports) and the ledger rows
built from it (sinks/ledger.py delivered_rows): no JVM, real Arrow."""
import time

import pyarrow as pa
import pytest

from sinks.base import BatchSummary, Sent
from sinks.driver_hold import SPOOLED
from sinks.kafka import (CLEAR, KAFKA_COLUMNS, RELEASED, HoldReports, hold_reporting,
                         release_due)
from sinks.ledger import LEDGER, delivered_rows
from state.columns import HEADERS
from streaming import job


class Accumulator:
    """A task's side of a Spark accumulator: each add merged as the driver merges it."""

    def __init__(self):
        self.param = HoldReports()
        self.value = HoldReports.zero(None)

    def add(self, update):
        self.value = self.param.addInPlace(self.value, update)


def output_rows(now_ms: int) -> pa.RecordBatch:
    """Rows as the hold stage gets them: two deliveries overdue, one due 300 ms from now, and a
    dead letter (no level)."""
    return pa.record_batch({
        "kind": ["deliver", "dead", "deliver", "deliver"],
        "topic": ["t", "dlq", "t", "u"],
        "partition": pa.array([0, None, None, 3], pa.int32()),
        "key": pa.array([None, None, b"kb", None], pa.binary()),
        "value": [b"a", b"x", b"b", b"c"],
        "headers": pa.array([[{"key": "UNIQ_KEY", "value": k}] for k in (b"k-a", b"", b"k-b", b"k-c")],
                            HEADERS),
        "uniq_key": ["k-a", None, "k-b", "k-c"],
        "level": pa.array([1, None, 2, 1], pa.int32()),
        "due_ms": pa.array([now_ms - 5_000, 0, now_ms + 300, now_ms - 10], pa.int64()),
        "append_ms": pa.array([now_ms - 6_000, now_ms, now_ms - 4_700, now_ms - 1_010], pa.int64()),
        "ipart": pa.array([0, 0, 1, 0], pa.int32()),
        "ioff": pa.array([10, 11, 7, 12], pa.int64()),
        "reason": pa.array([None, "bad", None, None], pa.string()),
        "received": pa.array([None] * 4, pa.int32()),
        "pending_delta": pa.array([None] * 4, pa.int32()),
    })


def unsent_rows() -> pa.RecordBatch:
    """Rows the hold only counts: two tallies of level 2, a parked cold message, a cancel's
    outcome."""
    return pa.record_batch({
        "kind": ["tally", "tally", "cold", "cancelled"],
        "topic": [None, None, "t", None],
        "partition": pa.array([None] * 4, pa.int32()),
        "key": pa.array([None] * 4, pa.binary()),
        "value": [None, None, b"later", None],
        "headers": pa.array([None] * 4, HEADERS),
        "uniq_key": [None, None, "k-cold", "k-gone"],
        "level": pa.array([2, 2, 3, 2], pa.int32()),
        "due_ms": pa.array([None, None, 9_000_000_000_000, 1], pa.int64()),
        "append_ms": pa.array([None, None, 1, 1], pa.int64()),
        "ipart": pa.array([None, None, 0, 0], pa.int32()),
        "ioff": pa.array([None, None, 20, 21], pa.int64()),
        "reason": pa.array([None] * 4, pa.string()),
        "received": pa.array([5, 2, None, None], pa.int32()),
        "pending_delta": pa.array([4, -1, None, None], pa.int32()),
    })


def counted(reports) -> dict:
    """The reports' counts as {(kind, topic, level, reason, clear): (count, received, delta)}."""
    total = {}
    for row in HoldReports.counts(reports.value):
        key = (row["kind"], row["topic"], row["level"], row["reason"], row[CLEAR])
        count, received, delta = total.get(key, (0, 0, 0))
        total[key] = (count + row["count"], received + (row["received"] or 0),
                      delta + (row["pending_delta"] or 0))
    return total


def test_a_hold_task_reports_each_delivery_once_with_the_moment_it_was_released():
    now_ms = int(time.time() * 1000)
    reports = Accumulator()
    out = []
    for chunk in hold_reporting(reports)(iter([output_rows(now_ms)])):
        left_ms = int(time.time() * 1000)
        out.extend((row, left_ms) for row in chunk.to_pylist())
    starts, released, later = HoldReports.read(reports.value)

    assert released.column_names == list(RELEASED)
    assert later is None, "the tasks' hold leaves nothing to the driver"
    rows = {r["uniq_key"]: r for r in released.to_pylist()}
    assert sorted(rows) == ["k-a", "k-b", "k-c"], "deliveries only, each once"
    left = {row["uniq_key"]: (row["sent_ms"], left_ms) for row, left_ms in out}
    for key, row in rows.items():
        assert row["due_ms"] <= row["sent_ms"], f"{key} reported as sent before due"
        assert row["sent_ms"] == left[key][0] <= left[key][1], key
    assert rows["k-b"]["partition"] is None and rows["k-c"]["partition"] == 3
    assert (rows["k-b"]["ipart"], rows["k-b"]["ioff"]) == (1, 7)
    # The task began releasing with the overdue rows, for every level it held.
    first = min(r["sent_ms"] for r in rows.values())
    assert starts == {1: first, 2: first}


def test_with_the_drivers_hold_a_task_sends_what_is_due_and_leaves_the_rest_to_the_driver():
    now_ms = int(time.time() * 1000)
    reports = Accumulator()
    began = time.time()
    out = [row for chunk in hold_reporting(reports, defer=True)(iter([output_rows(now_ms)]))
           for row in chunk.to_pylist()]
    assert time.time() - began < 0.25, "nothing waits for k-b, due 300 ms on"
    assert [r["due_ms"] for r in out] == sorted(r["due_ms"] for r in out), "in due order"
    assert sorted(r["ioff"] for r in out) == [10, 11, 12], "the overdue rows and the dead letter"
    assert all(r["due_ms"] <= r["sent_ms"] for r in out)
    starts, released, later = HoldReports.read(reports.value)
    assert sorted(released.column("uniq_key").to_pylist()) == ["k-a", "k-c"]
    assert later.column_names == list(SPOOLED)
    (row,) = later.to_pylist()
    assert (row["uniq_key"], row["key"], row["due_ms"], row["level"]) == ("k-b", b"kb", now_ms + 300, 2)
    assert row["headers"] == [{"key": "UNIQ_KEY", "value": b"k-b"}]
    assert counted(reports)[("deliver", "t", 2, None, True)] == (1, 0, 0), "counted all the same"


def test_a_task_that_sees_the_holds_hand_off_folder_hands_its_rows_over_in_a_file(tmp_path):
    """Where the task shares the folder with the driver's running hold (its marker is there),
    the rows not yet due go to a file there, in the spool's layout, and the report carries only
    the file's name; where it does not, they go in the report as before."""
    now_ms = int(time.time() * 1000)
    marker = tmp_path / ".hold-feedf00d"
    through_report = Accumulator()
    list(hold_reporting(through_report, defer=True, handoff=str(marker))(iter([output_rows(now_ms)])))
    assert HoldReports.files(through_report.value) == [], "no marker: not the hold's folder"
    _, _, expected = HoldReports.read(through_report.value)
    marker.touch()
    through_file = Accumulator()
    list(hold_reporting(through_file, defer=True, handoff=str(marker))(iter([output_rows(now_ms)])))
    (name,) = HoldReports.files(through_file.value)
    _, released, later = HoldReports.read(through_file.value)
    assert later is None and sorted(released.column("uniq_key").to_pylist()) == ["k-a", "k-c"]
    with pa.memory_map(str(tmp_path / name)) as source:
        handed = pa.ipc.open_file(source).read_all()
    assert handed.column_names == list(SPOOLED) + ["sent_ms"]
    assert handed.select(list(SPOOLED)).to_pylist() == expected.to_pylist()
    assert handed.column("sent_ms").null_count == handed.num_rows, "not sent yet"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([marker.name, name]), \
        "written under a temporary name, then renamed"


def test_the_split_is_by_the_clock_never_early():
    rows = output_rows(1_000_000)
    for now_ms in (999_999, 1_000_000, 1_000_300, 1_000_301):
        later = []
        out = pa.Table.from_batches(list(release_due(iter([rows]), later,
                                                     clock=lambda: now_ms / 1000)))
        sent = out.column("uniq_key").to_pylist() if out.num_rows else []
        kept = later[0].column("uniq_key").to_pylist() if later else []
        assert sorted(sent + kept, key=str) == sorted(rows.column("uniq_key").to_pylist(), key=str)
        assert all(d <= now_ms for d in (out.column("due_ms").to_pylist() if out.num_rows else []))
        assert all(d > now_ms for d in (later[0].column("due_ms").to_pylist() if later else []))
        assert ("k-b" in sent) == (now_ms >= 1_000_300)


def test_reports_of_several_tasks_add_up():
    param = HoldReports()
    total = HoldReports.zero(None)
    now_ms = int(time.time() * 1000)
    for task in range(3):
        acc = Accumulator()
        batch = output_rows(now_ms - 1_000)   # all overdue: no waiting
        list(hold_reporting(acc)(iter([batch])))
        acc.value["starts"] = {1: 100 + task, 2: 200 - task}
        total = param.addInPlace(total, acc.value)
    starts, released, _ = HoldReports.read(total)
    assert released.num_rows == 9
    assert starts == {1: 102, 2: 200}, "the latest report per level"


def test_a_task_with_no_rows_reports_nothing():
    acc = Accumulator()
    assert list(hold_reporting(acc)(iter([]))) == []
    assert HoldReports.read(acc.value) == ({}, None, None)
    assert HoldReports.counts(acc.value) == []


@pytest.mark.parametrize("defer", [False, True])
def test_the_hold_yields_only_what_the_kafka_writer_takes_and_still_reports_the_rest(defer):
    now_ms = int(time.time() * 1000)
    full, narrow = Accumulator(), Accumulator()
    whole = [row for chunk in hold_reporting(full, defer)(iter([output_rows(now_ms - 1_000)]))
             for row in chunk.to_pylist()]
    sent = [chunk for chunk in hold_reporting(narrow, defer, KAFKA_COLUMNS)(
        iter([output_rows(now_ms - 1_000)]))]
    assert sent and all(chunk.schema.names == list(KAFKA_COLUMNS) for chunk in sent)
    rows = [row for chunk in sent for row in chunk.to_pylist()]
    assert rows == [{name: row[name] for name in KAFKA_COLUMNS} for row in whole]
    _, released, _ = HoldReports.read(narrow.value)
    assert released.column_names == list(RELEASED) and released.num_rows == 3
    assert counted(narrow) == counted(full)


def test_a_hold_task_counts_every_row_it_takes_and_sends_only_deliveries_and_dead_letters():
    now_ms = int(time.time() * 1000)
    acc = Accumulator()
    sent = [row for chunk in hold_reporting(acc)(iter([unsent_rows(), output_rows(now_ms - 1_000)]))
            for row in chunk.to_pylist()]
    assert sorted(r["ioff"] for r in sent) == [7, 10, 11, 12]
    assert counted(acc) == {
        ("tally", None, 2, None, True): (2, 7, 3),
        ("cold", "t", 3, None, True): (1, 0, 0),
        ("cancelled", None, 2, None, True): (1, 0, 0),
        ("deliver", "t", 1, None, True): (1, 0, 0),
        ("deliver", "t", 2, None, True): (1, 0, 0),
        ("deliver", "u", 1, None, True): (1, 0, 0),
        ("dead", "dlq", None, "bad", True): (1, 0, 0),
    }


def test_a_task_with_only_rows_it_does_not_send_reports_their_counts():
    acc = Accumulator()
    assert list(hold_reporting(acc)(iter([unsent_rows()]))) == []
    assert HoldReports.read(acc.value) == ({}, None, None)
    assert counted(acc)[("tally", None, 2, None, True)] == (2, 7, 3)


def test_deliveries_the_clearance_did_not_pass_are_counted_apart_and_not_sent():
    now_ms = int(time.time() * 1000)
    rows = output_rows(now_ms - 1_000)
    rows = rows.append_column(CLEAR, pa.array([True, True, False, True]))
    acc = Accumulator()
    sent = [row for chunk in hold_reporting(acc)(iter([rows])) for row in chunk.to_pylist()]
    assert sorted(r["ioff"] for r in sent) == [10, 11, 12], "the withheld delivery stays"
    assert CLEAR not in sent[0], "the hold's output is the sent layout"
    assert counted(acc)[("deliver", "t", 2, None, False)] == (1, 0, 0)
    _, released, _ = HoldReports.read(acc.value)
    assert sorted(released.column("uniq_key").to_pylist()) == ["k-a", "k-c"]


def test_ledger_rows_from_the_reports():
    released = pa.table({
        "uniq_key": ["a", "b"], "topic": ["t", "t"],
        "partition": pa.array([None, 1], pa.int32()), "level": pa.array([1, 18], pa.int32()),
        "ipart": pa.array([0, 17], pa.int32()), "ioff": pa.array([5, 6], pa.int64()),
        "append_ms": pa.array([1, 2], pa.int64()),
        "due_ms": pa.array([86_399_990, 1_795_446_630_707], pa.int64()),
        "sent_ms": pa.array([86_400_001, 1_795_446_630_800], pa.int64()),
    })
    rows = delivered_rows(released, BatchSummary(7, 1_795_446_630_000))
    assert rows.schema == LEDGER
    a, b = rows.to_pylist()
    assert a == {"uniq_key": "a", "topic": "t", "partition": None, "level": 1,
                 "intake_partition": 0, "intake_offset": 5, "append_ms": 1, "due_ms": 86_399_990,
                 "sent_ms": 86_400_001, "lateness_ms": 11, "batch_id": 7,
                 "batch_time": 1_795_446_630_000, "sent_date": "1970-01-02"}
    assert (b["lateness_ms"], b["sent_date"], b["intake_partition"]) == (93, "2026-11-23", 17)


@pytest.mark.parametrize("reported", [None, 2])
def test_a_batch_whose_reports_miss_a_delivery_collects_its_ledger_rows_with_spark(
        monkeypatch, reported):
    summary = BatchSummary(3)
    summary.add("deliver", 1, None, 3)
    if reported is not None:
        summary.released = pa.table({name: pa.array([1] * reported, pa.int64())
                                     for name in RELEASED})
    collected = []
    monkeypatch.setattr(job, "collected_rows", lambda frame, s: collected.append((frame, s)) or "spark")
    assert job._ledger_rows(Sent(lambda: "the sent frame"), summary) == "spark"
    assert collected == [("the sent frame", summary)]


def test_the_sent_frame_is_built_once_and_only_when_asked_for():
    built = []
    sent = Sent(lambda: built.append(1) or "frame")
    assert built == []
    assert sent.frame() == sent.frame() == "frame"
    assert built == [1]


def test_a_batch_whose_reports_hold_every_delivery_uses_them():
    now_ms = int(time.time() * 1000)
    acc = Accumulator()
    list(hold_reporting(acc)(iter([output_rows(now_ms - 1_000)])))
    summary = BatchSummary(4)
    summary.add("deliver", 1, None, 3)
    summary.add("dead", None, "bad", 1)
    _, summary.released, _ = HoldReports.read(acc.value)
    rows = job._ledger_rows(Sent(lambda: pytest.fail("built the sent frame")), summary)
    assert sorted(rows.column("uniq_key").to_pylist()) == ["k-a", "k-b", "k-c"]


def test_ledger_dates_are_the_utc_date_of_every_row():
    """sent_date is formatted once per distinct day and mapped back: the same as formatting
    each row (across day boundaries, chunks, and times decades apart)."""
    import numpy as np
    import pyarrow.compute as pc

    from sinks.ledger import _utc_dates

    day = 86_400_000
    times = np.concatenate([np.random.default_rng(7).integers(0, 4_000_000_000_000, 20_000),
                            20_000 * day + np.arange(-3, 4), [0, day - 1, day]])
    column = pa.chunked_array([pa.array(times[:9_000], pa.int64()),
                               pa.array(times[9_000:], pa.int64())])
    expected = pc.strftime(column.cast(pa.timestamp("ms")), "%Y-%m-%d").to_pylist()
    assert _utc_dates(column).to_pylist() == expected
    assert _utc_dates(pa.chunked_array([pa.array([day - 1, day], pa.int64())])).to_pylist() == \
        ["1970-01-01", "1970-01-02"]
