"""The signed result: the envelope built from a run's parts, attestations, bundle export and
verification, a result compared with its replays', and the report page of a run (report/)."""

__all__: list[str] = []
