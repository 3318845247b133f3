"""The wheel query: intake → parse → wheel (applyInPandasWithState) → the ready topic, and the
reads of its state."""
from __future__ import annotations

import logging
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

from conf.settings import Settings
from sinks import store
from state.split import LEGACY_WHEEL_HEADERS, legacy_values
from state import headers as H
from state.parse import make_parser
from state.columns import REFS_DDL
from state.envelope import Rules
from state.groups import WheelConfig
from state.wheel import make_wheel
from streaming.kafka.config import spark_options
from streaming.wheel.schema import INDEX_ENVELOPE_SPARK, STATE_SPARK, WHEEL_OUT_SPARK

log = logging.getLogger(__name__)


def intake_stream(spark: SparkSession, settings: Settings) -> DataFrame:
    reader = (spark.readStream.format("kafka")
              .options(**spark_options(settings))
              .option("subscribe", settings.intake_topic)
              .option("startingOffsets", "earliest")
              .option("includeHeaders", "true")
              # Intake writes of an aborted transaction are never delivered (dispatch: likewise).
              .option("kafka.isolation.level", "read_committed")
              # Intake data deleted before it was read is a loss: stop and say so.
              .option("failOnDataLoss", "true"))
    if settings.max_offsets_per_trigger > 0:
        reader = reader.option("maxOffsetsPerTrigger", settings.max_offsets_per_trigger)
    return reader.load().select("key", "value", F.col("partition").alias("ipart"),
                                F.col("offset").alias("ioff"),
                                F.unix_millis("timestamp").alias("append_ms"), "headers")


def wheel_stream(source: DataFrame, rules: Rules, config: WheelConfig,
                 overdue_before_ms: int = 0) -> DataFrame:
    """The wheel's fired WHEEL_OUT rows from `source` (`intake_stream`); level messages due
    before `overdue_before_ms` (0: none) pass through without state."""
    window = config.direct_max_delay_ms
    parsed = index_of(source.filter(~surely_direct(rules, window)) if window >= 0 else source
                      ).mapInArrow(make_parser(rules, config.slot_ms, config.spread, window,
                                               overdue_before_ms=overdue_before_ms),
                                   INDEX_ENVELOPE_SPARK)
    timed = (parsed.withColumn("event_time", F.timestamp_millis("append_ms"))
             .withWatermark("event_time", f"{config.watermark_delay_ms} milliseconds"))
    return timed.groupBy("bucket", "slot").applyInPandasWithState(
        make_wheel(config), WHEEL_OUT_SPARK, STATE_SPARK, "append",
        GroupStateTimeout.EventTimeTimeout)


def index_of(intake: DataFrame) -> DataFrame:
    """Position, append time and control headers: key, value and user headers stay in the JVM."""
    control = sorted(H.CONTROL_HEADERS)
    return intake.select("ipart", "ioff", "append_ms",
                         F.filter("headers", lambda h: h["key"].isin(*control)).alias("headers"))


def surely_direct(rules: Rules, window_ms: int) -> F.Column:
    """The plainest of the records the dispatch tasks take (state/split.py `is_direct`), left
    out of the wheel at once in the JVM: at most one DELAY header whose value names a level of
    at most the window as written ("0", "1", …; the older split's rule), no other delay, cancel
    or service header. The wheel's parse leaves out the rest (state/parse.py): a JVM form of
    the whole rule took 4 times this one's CPU and 5 times the batch's planning. Only array
    functions Spark compiles: a lambda over the headers (`exists`) is evaluated row by row in
    its interpreter, a sixth of the Spark JVM's samples at 5,000 timers/s."""
    headers = F.coalesce("headers", F.array().cast("array<struct<key:string,value:binary>>"))
    keys = headers.getField("key")
    texts = sorted(v.decode() for v in legacy_values(rules, window_ms))
    legacy = F.array(*(F.lit(k) for k in sorted(LEGACY_WHEEL_HEADERS)))
    delay = F.array_position(keys, H.DELAY).cast("int")   # 1-based; 0: none
    value = F.get(headers.getField("value"), delay - 1).cast("string")   # none: null
    plain = ~F.coalesce(F.arrays_overlap(keys, legacy), F.lit(False)) & (
        (delay == 0) | F.coalesce(value.isin(*texts), F.lit(False)))
    return plain & (F.size(F.array_remove(keys, H.DELAY)) >= F.size(keys) - 1)


def pending_by_level(spark: SparkSession, checkpoint: str,
                     batch_id: int | None = None) -> dict[int, int]:
    """Messages held per level as of committed batch `batch_id` (None: the last); {} if none."""
    root = store.path(checkpoint)
    if not (root / "state" / "0").is_dir() or not (root / "commits").is_dir():
        return {}
    groups = wheel_state(spark, checkpoint, batch_id, references=False)
    rows = groups.groupBy("bucket").agg(F.sum("count").alias("n")).collect()
    return {int(r["bucket"]): int(r["n"] or 0) for r in rows}


def wheel_state(spark: SparkSession, checkpoint: str, batch_id: int | None = None,
                references: bool = True) -> DataFrame:
    """One row per group: bucket, slot, count and, with `references`, a list per reference
    column (state/columns.py)."""
    spark.streams.active  # the state reader needs the state store coordinator
    reader = spark.read.format("statestore")
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    state = reader.load(checkpoint)
    held = "value.groupState"   # flatMapGroupsWithState's state format 2: (groupState, timeout)
    groups = state.where(F.col(f"{held}.count").isNotNull()).select(
        F.col("key.bucket").alias("bucket"), F.col("key.slot").alias("slot"),
        F.col(f"{held}.count").alias("count"), F.col(f"{held}.refs").alias("refs"))
    if not references:
        return groups.drop("refs")
    return groups.select("bucket", "slot", "count", F.from_json("refs", REFS_DDL).alias("r")) \
        .select("bucket", "slot", "count", "r.*")
