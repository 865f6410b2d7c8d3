"""The signed result: the envelope built from a run's parts, attestations, bundle export and
verification, and a result compared with its replays'."""

__all__: list[str] = []
