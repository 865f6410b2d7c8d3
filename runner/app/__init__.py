"""The runner as a program on a host: host settings, the issuer, the warm server and batch,
schemas, and re-grading (`runner parse`).
"""

__all__: list[str] = []
