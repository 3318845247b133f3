"""`delayq`: the command line (the one place that also reaches the local tools in streaming/tools/)."""
