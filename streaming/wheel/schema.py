"""Spark schemas of the Arrow layouts in `state.columns` (one definition, two type systems)."""
from __future__ import annotations

from pyspark.sql.pandas.types import from_arrow_schema

from state.columns import INDEX_ENVELOPE, STATE, WHEEL_OUT, WITH_BODY

INDEX_ENVELOPE_SPARK = from_arrow_schema(INDEX_ENVELOPE)
STATE_SPARK = from_arrow_schema(STATE)
WHEEL_OUT_SPARK = from_arrow_schema(WHEEL_OUT)
WITH_BODY_SPARK = from_arrow_schema(WITH_BODY)
