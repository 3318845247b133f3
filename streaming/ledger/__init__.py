"""The delivery ledger: its records (written by the dispatch tasks), the query that copies them into Delta, its upkeep and `delayq ledger`."""
