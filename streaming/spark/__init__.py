"""Spark plumbing: the session, its jars and class data archive, listeners, spark-submit."""
