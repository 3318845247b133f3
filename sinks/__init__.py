"""Where delivered and rejected messages go: Kafka real topics, dead letters, Delta tables."""
