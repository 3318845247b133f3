"""The progress listeners read Spark's own JSON of each report, for their query only."""
from __future__ import annotations

import json
import time

from streaming.spark.listener import ProgressJsonListener
from tests.support import assert_eventually


def test_a_listener_gets_its_query_reports_as_spark_json_for_each_observer(spark, work_dir):
    name = f"listened-{time.time_ns()}"
    collected, also, elsewhere = [], [], []
    ours = ProgressJsonListener(name, collected.append, also.append)
    other = ProgressJsonListener("another-query", elsewhere.append)
    # The reports come as the JVM's JSON alone, never through PySpark's field-by-field event.
    converted = []
    ours.onQueryProgress = converted.append
    spark.streams.addListener(ours)
    spark.streams.addListener(other)
    query = (spark.readStream.format("rate").option("rowsPerSecond", 20).load()
             .writeStream.format("noop").queryName(name)
             .option("checkpointLocation", str(work_dir / name))
             .trigger(processingTime="500 milliseconds").start())
    try:
        assert_eventually(lambda: len(collected) >= 3, timeout_s=60,
                          message="three progress reports")
    finally:
        query.stop()
        spark.streams.removeListener(ours)
        spark.streams.removeListener(other)
    assert not elsewhere and not converted
    assert also == collected[:len(also)]
    by_batch = {p["batchId"]: p for p in query.recentProgress}
    for report in collected:
        assert report["name"] == name
        assert report["durationMs"]["triggerExecution"] >= 0
        assert report["sources"][0]["description"].startswith("RateStreamV2")
        if report["batchId"] in by_batch:
            assert report["numInputRows"] == by_batch[report["batchId"]]["numInputRows"]
            # PySpark keeps a source's offsets as the JSON text Spark gave it; the report
            # carries them parsed.
            theirs = by_batch[report["batchId"]]["sources"][0]["endOffset"]
            assert report["sources"][0]["endOffset"] == json.loads(theirs)
