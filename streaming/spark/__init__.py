"""Spark plumbing: the session, its jars and class data archive, progress listeners, spark-submit."""
