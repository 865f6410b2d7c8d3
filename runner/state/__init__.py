"""What survives a restart: the job folder (its layout, lock and budget file) and the
cumulative, hash-chained runtime-budget ledger."""

__all__: list[str] = []
