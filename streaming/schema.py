"""Spark schemas of the Arrow layouts in `state.columns` (one definition, two type systems)."""
from __future__ import annotations

from pyspark.sql.pandas.types import from_arrow_schema

from state.columns import ENVELOPE, OUTPUT, WHEEL_OUT

ENVELOPE_SPARK = from_arrow_schema(ENVELOPE)
OUTPUT_SPARK = from_arrow_schema(OUTPUT)
WHEEL_OUT_SPARK = from_arrow_schema(WHEEL_OUT)
