"""The ledger spool's Delta append with delta-rs (sinks/delta.py append_arrow_once), on a real
Delta table on disk, without a JVM. Spark reading these commits, and Spark's own appends
beside them, are covered by tests/integration/test_ledger.py and the kill test."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

deltalake = pytest.importorskip("deltalake")

from sinks.delta import append_arrow_once  # noqa: E402
from sinks.store import is_local  # noqa: E402
from sinks.ledger import LedgerSpool  # noqa: E402

SCHEMA = pa.schema([("uniq_key", pa.string()), ("partition", pa.int32()),
                    ("sent_ms", pa.int64()), ("sent_date", pa.string())])


def rows(*keys, day="2026-11-23"):
    # Columns in another order and a wider type than the table's: the append casts them.
    return pa.table({"sent_date": [day] * len(keys), "sent_ms": pa.array([1] * len(keys)),
                     "partition": pa.array([None] * len(keys), pa.int64()),
                     "uniq_key": list(keys)})


def table_rows(path) -> list[str]:
    table = deltalake.DeltaTable(str(path))
    return sorted(k for f in table.file_uris()
                  for k in pq.read_table(f.removeprefix("file://")).column("uniq_key").to_pylist())


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "ledger"
    deltalake.write_deltalake(str(path), SCHEMA.empty_table(), partition_by=["sent_date"])
    return path


def test_an_append_is_one_commit_and_a_version_it_has_is_skipped(table):
    assert append_arrow_once(rows("a", "b"), table, "query-1", 7, ("sent_date",))
    assert not append_arrow_once(rows("a", "b"), table, "query-1", 7, ("sent_date",))
    assert not append_arrow_once(rows("x"), table, "query-1", 5, ("sent_date",)), "older version"
    assert append_arrow_once(rows("c"), table, "query-2", 1, ("sent_date",)), "another query"
    assert append_arrow_once(rows("d", day="2026-11-24"), table, "query-1", 8, ("sent_date",))
    assert table_rows(table) == ["a", "b", "c", "d"]
    dt = deltalake.DeltaTable(str(table))
    assert (dt.version(), dt.transaction_version("query-1"), dt.transaction_version("query-2")) \
        == (3, 8, 1), "create, then three appends"
    assert sorted(p.name for p in table.iterdir() if p.name.startswith("sent_date=")) == [
        "sent_date=2026-11-23", "sent_date=2026-11-24"]


def test_the_txn_action_is_the_one_spark_reads(table):
    append_arrow_once(rows("a"), table, "query-1", 3, ("sent_date",))
    actions = [json.loads(line) for line in
               (table / "_delta_log" / "00000000000000000001.json").read_text().splitlines()]
    assert {"appId": "query-1", "version": 3} in [
        {k: a["txn"][k] for k in ("appId", "version")} for a in actions if "txn" in a]


def test_the_spool_appends_its_files_once_through_the_ledger(tmp_path, table):
    class Ledger:   # DeliveryLedger.append's local path, with a fixed query id
        def append(self, spark, files, txn_version):
            whole = pa.concat_tables([pq.read_table(f) for f in files])
            append_arrow_once(whole, table, "query-1", txn_version, ("sent_date",))

    spool = LedgerSpool(None, Ledger(), tmp_path / "spool", single_until=2)
    for batch, key in [(1, "a"), (2, "b"), (3, "c"), (4, "d")]:
        spool.put(batch, rows(key))
    # Batch 1 was appended by an earlier run that died before deleting its file.
    append_arrow_once(rows("a"), table, "query-1", 1, ("sent_date",))
    spool.start().stop()
    assert table_rows(table) == ["a", "b", "c", "d"]
    assert not spool.files()


@pytest.mark.parametrize("path, local", [
    ("/data/tables/ledger", True), ("data/ledger", True), ("file:/data/ledger", True),
    ("s3a://bucket/ledger", False), ("hdfs://nn:8020/ledger", False)])
def test_only_a_table_on_the_local_file_system_is_appended_without_spark(path, local):
    assert is_local(path) is local
