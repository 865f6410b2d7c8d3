"""The egress allowlist's test topology: it lives in :mod:`runner.testing.egress` (the
benchmark uses it too); re-exported here for the tests."""

from runner.testing.egress import PORT, SERVER, Outside, left_behind, outside

__all__ = ["PORT", "SERVER", "Outside", "left_behind", "outside"]
