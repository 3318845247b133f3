"""The wheel: delay levels, the rules of time, header validation and the wheel's state.
All plain Python, unit-tested without a JVM, but processor.py's Spark glue."""
