"""The Spark job and its surroundings: session, local broker, source, routing, CLI, producer."""
