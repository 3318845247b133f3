"""The delivery ledger: the dispatch tasks' records, their Delta query, upkeep, `delayq ledger`."""
