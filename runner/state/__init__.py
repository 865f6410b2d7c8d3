"""What survives a restart: the cumulative, hash-chained runtime-budget ledger."""
