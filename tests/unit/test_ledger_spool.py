"""The ledger spool: files, order, grouping and retries (no JVM: the Delta append is replaced
by a recorder; the Delta side is covered by tests/integration/test_ledger.py and the kill test)."""
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sinks.ledger import LedgerSpool, delivered_row


class Recorder:
    """Stands in for DeliveryLedger.append: keeps (txn_version, uniq_keys) per call, and can
    fail a number of calls first."""

    def __init__(self, failures: int = 0):
        self.calls, self.failures = [], failures

    def append(self, spark, files, txn_version: int) -> None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("Delta unavailable\nstack")
        keys = [k for f in files for k in pq.read_table(f).column("uniq_key").to_pylist()]
        self.calls.append((txn_version, keys))


def rows(*keys):
    return pa.table({"uniq_key": pa.array(keys, pa.string()),
                     "lateness_ms": pa.array([1] * len(keys), pa.int64())})


def wait_for(check, timeout_s=10):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_put_writes_a_file_per_batch_that_survives_the_process(tmp_path):
    spool = LedgerSpool(None, Recorder(), tmp_path / "spool")
    spool.put(7, rows("a", "b"))
    spool.put(12, rows("c"))
    assert [p.name for p in spool.files()] == ["0000000000000000007.parquet",
                                               "0000000000000000012.parquet"]
    assert not list((tmp_path / "spool").glob(".*")), "no temporary file left behind"
    # A new spool on the same folder (the next start) appends them, in batch order.
    ledger = Recorder()
    LedgerSpool(None, ledger, tmp_path / "spool", single_until=20).start().stop()
    assert ledger.calls == [(7, ["a", "b"]), (12, ["c"])]
    assert not spool.files()


def test_files_that_may_be_in_the_table_go_alone_later_ones_together(tmp_path):
    ledger = Recorder()
    spool = LedgerSpool(None, ledger, tmp_path / "spool", single_until=5)
    for batch, key in ((4, "a"), (5, "b"), (6, "c"), (8, "d"), (9, "e")):
        spool.put(batch, rows(key))
    spool.start().stop()
    # 4 and 5 may be in the Delta table already (a previous run, or the replayed batch):
    # each with its own txnVersion, so Delta skips what it has. 6..9 only this run spooled.
    assert ledger.calls == [(4, ["a"]), (5, ["b"]), (9, ["c", "d", "e"])]


def test_a_group_stops_at_the_row_bound(tmp_path):
    ledger = Recorder()
    spool = LedgerSpool(None, ledger, tmp_path / "spool", max_rows=5)
    for batch in range(1, 6):
        spool.put(batch, rows(f"{batch}a", f"{batch}b"))
    spool.start().stop()
    assert [(v, len(k)) for v, k in ledger.calls] == [(2, 4), (4, 4), (5, 2)]


def test_a_failed_append_keeps_the_rows_and_is_retried(tmp_path, monkeypatch):
    ledger = Recorder(failures=1)
    behind = []
    spool = LedgerSpool(None, ledger, tmp_path / "spool", on_behind=behind.append)
    spool.put(3, rows("a"))
    monkeypatch.setattr(spool._wake, "wait", lambda timeout=None: time.sleep(0.05))
    spool.start()
    wait_for(lambda: ledger.calls)
    spool.stop()
    assert ledger.calls == [(3, ["a"])]
    assert not spool.files()
    assert behind[0] == 1 and behind[-1] == 0


def test_stop_leaves_what_it_could_not_append_on_disk(tmp_path, monkeypatch):
    ledger = Recorder(failures=10**6)
    spool = LedgerSpool(None, ledger, tmp_path / "spool")
    spool.put(1, rows("a"))
    spool.start()
    wait_for(lambda: spool.last_error is not None)
    spool.stop(timeout_s=10)
    assert spool.last_error == "Delta unavailable"
    assert [p.name for p in spool.files()] == ["0000000000000000001.parquet"]


def test_a_put_cut_short_is_ignored(tmp_path):
    folder = tmp_path / "spool"
    folder.mkdir()
    (folder / ".0000000000000000002.parquet.tmp").write_bytes(b"partial")
    ledger = Recorder()
    LedgerSpool(None, ledger, folder).start().stop()
    assert ledger.calls == [] and not list(folder.iterdir())


def test_one_append_per_interval_and_a_stop_does_not_wait_for_it(tmp_path):
    ledger = Recorder()
    spool = LedgerSpool(None, ledger, tmp_path / "spool", interval_s=0.6).start()
    spool.put(1, rows("a"))
    spool.put(2, rows("b"))
    time.sleep(0.3)
    assert ledger.calls == [], "the oldest file is younger than the interval"
    wait_for(lambda: ledger.calls)
    assert ledger.calls == [(2, ["a", "b"])], "both batches in one commit"
    spool.put(3, rows("c"))
    started = time.monotonic()
    spool.stop()
    assert ledger.calls[-1] == (3, ["c"]) and time.monotonic() - started < 0.5


def test_a_file_an_earlier_run_left_goes_at_once(tmp_path):
    LedgerSpool(None, Recorder(), tmp_path / "spool").put(4, rows("a"))
    ledger = Recorder()
    spool = LedgerSpool(None, ledger, tmp_path / "spool", single_until=5, interval_s=60).start()
    wait_for(lambda: ledger.calls, timeout_s=5)
    spool.stop()
    assert ledger.calls == [(4, ["a"])]


def test_a_row_moving_from_the_spool_to_the_table_during_a_lookup_is_found(tmp_path):
    """`delayq ledger` reads the spool and the table one after the other; the spool thread may
    append a file and delete it in between. Whichever moment that happens, the row is found."""
    folder = tmp_path / "spool"
    LedgerSpool(None, Recorder(), folder).put(3, rows("k"))
    table = {}

    def move():   # what LedgerSpool._append does: commit to the table, then delete the file
        table["k"] = {"uniq_key": "k"}
        for path in folder.glob("*.parquet"):
            path.unlink()

    def table_then_move(key):   # the table is read just before the thread's commit lands
        found = table.get(key)
        move()
        return found

    assert delivered_row(folder, "k", table_then_move)["uniq_key"] == "k"
    assert delivered_row(folder, "k", table.get)["uniq_key"] == "k"   # now only in the table
    assert delivered_row(folder, "other", table.get) is None
