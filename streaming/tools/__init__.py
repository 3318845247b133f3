"""The tools around the job: the bench and its load generator, the local broker, cluster and
HDFS launchers, the demo and their commands."""
