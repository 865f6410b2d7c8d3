"""The signed result: the envelope built from a run's parts, attestations, bundle export and
verification, and the report page of a run (report/)."""

__all__: list[str] = []
