"""Work-arounds for defects of the pinned PySpark and Python, each with its evidence and exit
condition.

PySpark 4.1.1, applyInPandasWithState: the JVM pads the hidden state-info column with null
rows when a group has several data rows; pandas then turns the column's int32 children
(startOffset, numRows) into float64, and `RecordBatch.slice(0.0, 2.0)` raises
"TypeError: 'float' object cannot be interpreted as an integer" (reproduced here with pandas
2.2/2.3 and pyarrow 19-26). We cast them back to int. This module is imported by the wheel,
which the Python worker unpickles before it reads any data, so the patch is in place in every
worker. Remove when the pinned PySpark converts the state info itself.
"""
from __future__ import annotations

_STATE_INFO_FIELDS = ("startOffset", "numRows")


def _patch_apply_in_pandas_with_state() -> None:
    try:
        from pyspark.sql.pandas.serializers import ApplyInPandasWithStateSerializer as Ser
    except ImportError:  # no pyspark: pure-Python use of the state package
        return
    if getattr(Ser, "_delayq_patched", False):
        return
    import pyarrow.types as pa_types

    original = Ser.arrow_to_pandas

    def arrow_to_pandas(self, arrow_column, idx, *args, **kwargs):
        series = original(self, arrow_column, idx, *args, **kwargs)
        kind = arrow_column.type
        if pa_types.is_struct(kind) and kind.get_field_index("startOffset") >= 0:
            series = series.map(_ints)
        return series

    Ser.arrow_to_pandas = arrow_to_pandas
    Ser._delayq_patched = True


def _ints(info):
    if not info:
        return info
    return {**info, **{k: int(info[k]) for k in _STATE_INFO_FIELDS if info.get(k) is not None}}


_patch_apply_in_pandas_with_state()


# PySpark's worker calls importlib.invalidate_caches() at the start of every task
# (worker_util.setup_spark_files). On Python 3.10+ that makes every zipimporter on sys.path
# re-read its archive's directory, and the workers' sys.path holds Spark's own archives
# (pyspark.zip, the py4j zip, spark-core's jar). py-spy on an idle delayq job showed 96% of
# worker time there, ~250 ms per task. Those archives never change under a running worker, so
# their directories are read once; zips shipped with addPyFile are still re-read.
def _patch_zip_invalidation() -> None:
    import os
    import zipimport

    original = zipimport.zipimporter.invalidate_caches
    if getattr(original, "_delayq_patched", False):
        return

    def invalidate_caches(self):
        name = os.path.basename(getattr(self, "archive", ""))
        if name.endswith(".jar") or name == "pyspark.zip" or (
                name.startswith("py4j-") and name.endswith(".zip")):
            return
        original(self)

    invalidate_caches._delayq_patched = True
    zipimport.zipimporter.invalidate_caches = invalidate_caches


_patch_zip_invalidation()
