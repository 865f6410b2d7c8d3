"""runner: run a signed scientific reproduction contract in a sealed container.

Public API::

    from runner import run, verify, RunOptions, ResultEnvelope, RunnerError

Everything else is private and may change.
"""

from __future__ import annotations

from pathlib import Path

from runner.contract import VerifiedContract, load_contract
from runner.envelope import ResultEnvelope
from runner.errors import RunnerError
from runner.orchestrator import RunOptions, __version__, run


def verify(contract_path: str | Path) -> VerifiedContract:
    """Load and verify a contract (JSON, schema, digest, parser bindings); raise on refusal."""
    return load_contract(Path(contract_path))


__all__ = [
    "ResultEnvelope",
    "RunOptions",
    "RunnerError",
    "VerifiedContract",
    "__version__",
    "run",
    "verify",
]
