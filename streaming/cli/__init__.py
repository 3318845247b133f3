"""`delayq`: the command line (the one place that also reaches streaming/tools/)."""
