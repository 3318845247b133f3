"""Work-arounds for defects of the pinned PySpark and Python, each with its evidence and exit
condition. The wheel imports this module, and a Python worker unpickles the wheel before it reads
any data, so every worker has the patches; the body runs once per process.
"""
from __future__ import annotations

_STATE_INFO_FIELDS = ("startOffset", "numRows")


# PySpark 4.1.1's applyInPandasWithState pads the state-info column with null rows for a group of
# several rows, so pandas makes its int32 children floats and `RecordBatch.slice(0.0, 2.0)` raises
# TypeError: cast them back to int. Remove when the pinned PySpark converts the state info itself.
def _patch_apply_in_pandas_with_state() -> None:
    try:
        from pyspark.sql.pandas.serializers import ApplyInPandasWithStateSerializer as Ser
    except ImportError:  # no pyspark: pure-Python use of the state package
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


def _ints(info):
    if not info:
        return info
    return {**info, **{k: int(info[k]) for k in _STATE_INFO_FIELDS if info.get(k) is not None}}


_patch_apply_in_pandas_with_state()


# PySpark's worker invalidates the import caches every task (worker_util.setup_spark_files), so on
# Python 3.10+ every zip on sys.path re-reads its directory; Spark's own archives never change under
# a worker, so they skip it (the re-reads were most of an idle worker's time and 27-30% of the
# workers' CPU under load); addPyFile's zips are still re-read. Remove when PySpark stops doing so.
def _patch_zip_invalidation() -> None:
    import os
    import zipimport

    original = zipimport.zipimporter.invalidate_caches

    def invalidate_caches(self):
        name = os.path.basename(getattr(self, "archive", ""))
        if name.endswith(".jar") or name == "pyspark.zip" or (
                name.startswith("py4j-") and name.endswith(".zip")):
            return
        original(self)

    zipimport.zipimporter.invalidate_caches = invalidate_caches


_patch_zip_invalidation()
