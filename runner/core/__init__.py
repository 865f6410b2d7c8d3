"""The runner's own ground floor: errors and their categories, logging, safe file access, file
locks, host identity, safe archives, bounded JSON, fields of untrusted JSON, secret redaction,
the clock tests can control.
Imports nothing else of the runner.
"""

__all__: list[str] = []
