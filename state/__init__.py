"""The wheel: delay levels, the rules of time, header validation and the state function.

Everything here except `wheel.py`'s Spark glue is plain Python, unit-tested without a JVM.
"""
