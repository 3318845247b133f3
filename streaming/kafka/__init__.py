"""Kafka plumbing shared by every stage: client settings and topic administration."""
