"""The dispatch stage: a task per ready partition sends each fired message to its topic when due."""
