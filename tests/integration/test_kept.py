"""A micro-batch is computed once for all its sinks, kept as rows, and dropped when it ends."""
from __future__ import annotations

from pyspark.sql import functions as F

from streaming.wheel.writer import kept


def test_a_kept_batch_is_computed_once_and_dropped_on_release(spark):
    computed = spark.sparkContext.accumulator(0)

    def counted(batches):
        for batch in batches:
            computed.add(batch.num_rows)
            yield batch

    # Rows with a payload, as a batch of the wheel has, made by Python as the wheel's are.
    frame = (spark.range(0, 5_000, numPartitions=2)
             .withColumn("value", F.expr("repeat('x', 1000)"))
             .mapInArrow(counted, "id long, value string"))
    batch, release = kept(frame)
    assert computed.value == 0   # nothing runs until the batch's first action

    assert batch.count() == 5_000
    assert batch.filter("id % 2 = 0").count() == 2_500
    rows = batch.collect()
    assert sorted(r.id for r in rows) == list(range(5_000))
    assert {len(r.value) for r in rows} == {1000}
    # Three actions, one computation: the wheel of a real batch must not run twice.
    assert computed.value == 5_000

    rdd_id = batch._jdf.queryExecution().logical().rdd().id()
    assert rdd_id in spark.sparkContext._jsc.getPersistentRDDs()
    release()
    assert rdd_id not in spark.sparkContext._jsc.getPersistentRDDs()


def filtered(spark, logger: str, message: str) -> bool:
    """Whether the session JVM's log4j2 configuration drops a WARN `message` of `logger`."""
    log4j = spark._jvm.org.apache.logging.log4j
    config = log4j.LogManager.getContext(False).getConfiguration().getLoggerConfig(logger)
    assert config.getName() == logger, f"no logger config of its own for {logger}"
    event = (spark._jvm.org.apache.logging.log4j.core.impl.Log4jLogEvent.newBuilder()
             .setLoggerName(logger).setLevel(log4j.Level.WARN)
             .setMessage(log4j.message.SimpleMessage(message)).build())
    return config.isFiltered(event)


def test_the_warning_spark_logs_at_each_release_is_filtered_and_no_other(spark):
    """Spark warns at every release that the kept rows' lineage was truncated (four lines a
    second on `delayq run`'s console); conf/log4j2.properties drops that message, in the JVM
    the session runs, and lets the same logger's other warnings through."""
    name = "org.apache.spark.rdd.MapPartitionsRDD"
    assert filtered(spark, name, "RDD 3 was locally checkpointed, its lineage has been "
                                 "truncated and cannot be recomputed after unpersisting")
    assert not filtered(spark, name, "RDD 3 could not be unpersisted")


def test_the_warning_of_a_clean_stop_is_filtered_and_no_other(spark):
    """A clean stop stops the query between batches; Spark then warns that it found no job of
    the query's group to cancel. That message is dropped; the scheduler's others are not."""
    name = "org.apache.spark.scheduler.DAGScheduler"
    assert filtered(spark, name, "Failed to cancel job group 0f4ca958-dcea-4304-b561-"
                                 "d7093da01319. Cannot find active jobs for it.")
    assert not filtered(spark, name, "Failed to cancel job group 0f4ca958. Job 3 is not "
                                     "cancellable.")
    assert not filtered(spark, name, "Broadcasting large task binary with size 1.1 MiB")


def test_a_batch_whose_kept_rows_are_gone_fails_with_the_condition_the_runner_restarts_on(spark):
    """Blocks of a kept batch lost (as with an executor) fail its next action with Spark's
    CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND, which the batch writer reads off the error
    (streaming/runner.py starts the job again on it)."""
    import pytest

    from streaming.wheel.writer import LOST_KEPT_ROWS, error_conditions

    batch, _ = kept(spark.range(0, 100, numPartitions=2))
    assert batch.count() == 100
    batch._jdf.queryExecution().logical().rdd().unpersist(True)   # the blocks, gone
    with pytest.raises(Exception) as failure:
        batch.count()
    assert LOST_KEPT_ROWS in error_conditions(failure.value)
    assert error_conditions(ValueError("other")) == set()
