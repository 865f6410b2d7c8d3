"""Reading what a job left: evidence through the parsers, and the job's self-report check."""

__all__: list[str] = []
