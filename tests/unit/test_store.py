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


def test_an_s3_store_gets_s3a_and_delta_rs_the_same_endpoint_and_credentials(tmp_path):
    """An s3a:// store: S3A's settings, the object store's checkpoint manager and the S3 jars in
    Spark's; the same endpoint, style and credentials for delta-rs (`delayq ledger`); the
    secret never in a printed setting. Any other store: none of them."""
    from streaming.spark.session import OBJECT_STORE_CHECKPOINTS, spark_conf

    settings = load_settings(data_dir=tmp_path, store="s3a://bucket/delayq",
                             s3_endpoint="http://127.0.0.1:9000", s3_path_style=True,
                             s3_access_key="key", s3_secret_key="hush")
    conf = spark_conf(settings)
    assert conf["spark.sql.streaming.checkpointFileManagerClass"] == OBJECT_STORE_CHECKPOINTS
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.secret.key"] == "hush"
    assert "/s3/hadoop-aws-" in conf["spark.jars"]
    assert store.object_store_options(settings) == {
        "AWS_REGION": "us-east-1", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "hush"}
    assert "hush" not in repr(settings) and "hush" not in str(settings.model_dump())
    aws = load_settings(data_dir=tmp_path, store="s3a://bucket/delayq")   # AWS's own S3
    assert "spark.hadoop.fs.s3a.endpoint" not in spark_conf(aws)
    assert "spark.hadoop.fs.s3a.access.key" not in spark_conf(aws)
    assert store.object_store_options(aws) == {"AWS_REGION": "us-east-1",
                                               "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true"}
    hdfs = load_settings(data_dir=tmp_path, store="hdfs://nn:8020/delayq")
    assert not any("s3" in key for key in spark_conf(hdfs)) and \
        store.object_store_options(hdfs) == {}


def test_s3a_built_for_another_hadoop_than_pyspark_s_is_refused(tmp_path):
    import pytest

    from state.errors import ConfigError
    from streaming.spark.jars import s3_jars

    (tmp_path / "s3").mkdir()
    settings = load_settings(data_dir=tmp_path, jars_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="no hadoop-aws"):
        s3_jars(settings)
    (tmp_path / "s3" / "hadoop-aws-3.3.4.jar").touch()
    with pytest.raises(ConfigError, match="not the S3A of pyspark's Hadoop"):
        s3_jars(settings)
