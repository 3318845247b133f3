"""Spark's own Python workers settle their collector at their first task (state/worker.py):
the reuse that makes PySpark collect after every task is what `settle` looks for."""
from __future__ import annotations

import pyarrow as pa

from state.parse import make_parser
from tests.unit.test_wheel import RULES


def test_a_spark_python_worker_freezes_what_it_holds_at_the_parse(spark):
    def probe(batches):
        import gc
        import os

        from state import worker

        # As at this worker's first task, whatever tasks it ran before in this session.
        worker._settled = False
        gc.unfreeze()
        before = gc.get_freeze_count()
        for batch in batches:
            pass
        list(make_parser(RULES, 1_000, 2)(iter([])))   # the job's parse, on no rows
        yield pa.record_batch({"reused": [bool(os.environ.get("SPARK_REUSE_WORKER"))],
                               "before": [before], "after": [gc.get_freeze_count()]})

    [row] = (spark.range(1, numPartitions=1)
             .mapInArrow(probe, "reused boolean, before long, after long").collect())
    assert row.reused
    assert row.before == 0
    assert row.after > 10_000   # pyarrow's, pandas' and PySpark's objects, among others
