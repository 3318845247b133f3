"""state/compat.py's patches of the pinned PySpark, through PySpark's own serializer (no JVM)."""
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.pandas.serializers import ApplyInPandasWithStateSerializer
from pyspark.sql.pandas.types import from_arrow_type

import state.compat  # noqa: F401  (the patches, as every worker has them)
from streaming.schema import STATE_SPARK

NAMES, VALUES = pa.list_(pa.string()), pa.list_(pa.binary())


def serializer():
    # As pyspark/worker.py builds it for applyInPandasWithState.
    return ApplyInPandasWithStateSerializer("UTC", False, True, STATE_SPARK, 10_000, False, False)


def pyspark_path(series, arrow_type):
    """What PySpark itself does with the column: a list per row, then Arrow."""
    rows = series.apply(lambda x: list(x) if x is not None else None)
    return pa.Array.from_pandas(rows, mask=rows.isnull(), type=arrow_type)


@pytest.mark.parametrize("arrow_type, rows", [
    (NAMES, [np.array(["trace", "tenant"], dtype=object), np.array([], dtype=object), None,
             ["a"], ("b", "c")]),
    (VALUES, [np.array([b"x", None], dtype=object), np.array([], dtype=object), None, [b""]]),
])
def test_header_lists_convert_to_the_same_arrow_column_as_pyspark_s_own_path(arrow_type, rows):
    series = pd.Series(rows, dtype=object)
    got = serializer()._create_array(series, arrow_type, arrow_cast=True)
    assert got.equals(pyspark_path(series, arrow_type))
    assert got.to_pylist()[2] is None


@pytest.mark.parametrize("arrow_type", [NAMES, VALUES])
def test_header_lists_skip_pyspark_s_per_row_converter(arrow_type):
    ser = serializer()

    def per_row(series):
        raise AssertionError("the per-row converter ran")
    # PySpark looks the column's converter up in this cache by its Spark type (serializers.py).
    ser._converter_cache[from_arrow_type(arrow_type, prefer_timestamp_ntz=True).json()] = per_row
    series = pd.Series([np.array(["a"] if arrow_type == NAMES else [b"a"], dtype=object)] * 3)
    assert ser._create_array(series, arrow_type, arrow_cast=True).to_pylist() == \
        [["a"] if arrow_type == NAMES else [b"a"]] * 3


def test_a_column_arrow_refuses_gets_pyspark_s_own_error():
    with pytest.raises(Exception, match="to Arrow Array"):
        serializer()._create_array(pd.Series([[1, 2]], dtype=object), NAMES, arrow_cast=True)


def test_other_columns_keep_pyspark_s_path():
    got = serializer()._create_array(pd.Series(["a", None], dtype=object), pa.string())
    assert got.to_pylist() == ["a", None]
