"""The signed result: the envelope built from a run's parts, attestations, and bundle export
and verification."""

__all__: list[str] = []
