"""The runner as a program on a host: host settings, the issuer, the warm server and batch,
schemas, re-grading (`runner parse`) and replays (`runner replay`).
"""

__all__: list[str] = []
