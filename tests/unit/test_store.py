"""The data location: a local folder as a pathlib.Path, a store's URI as a HadoopPath (read and
written through Spark's Hadoop client: tests/integration/test_store.py runs it on HDFS)."""
from pathlib import Path

from conf import load_settings
from sinks import store


def test_a_location_is_a_local_folder_or_a_store():
    assert store.path("/data/ckpt") == Path("/data/ckpt")
    assert store.path("file:///data/ckpt") == Path("/data/ckpt")
    remote = store.path("hdfs://nn:8020/delayq/ckpt/")
    assert isinstance(remote, store.HadoopPath)
    assert str(remote / "commits" / "7") == "hdfs://nn:8020/delayq/ckpt/commits/7"
    assert (remote / "commits").name == "commits" and (remote / "commits").parent == remote
    assert store.is_local("data/ckpt") and not store.is_local("s3a://bucket/ckpt")


def test_a_local_file_is_replaced_whole(tmp_path):
    target = tmp_path / "cold" / "loaded_until"
    store.write_atomic(target, '{"loaded_until": 1}')
    store.write_atomic(target, '{"loaded_until": 2}')
    assert target.read_text() == '{"loaded_until": 2}'
    assert [p.name for p in target.parent.iterdir()] == ["loaded_until"], "no temporary left"


def test_the_checkpoints_and_tables_live_under_the_store_when_one_is_set(tmp_path):
    local = load_settings(data_dir=tmp_path)
    assert local.checkpoint_path == f"{tmp_path}/checkpoints/delivery"
    remote = load_settings(data_dir=tmp_path, store="hdfs://nn:8020/delayq/")
    assert remote.checkpoint_path == "hdfs://nn:8020/delayq/checkpoints/delivery"
    assert remote.ledger_path == "hdfs://nn:8020/delayq/tables/ledger"
