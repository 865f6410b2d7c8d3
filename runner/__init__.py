"""runner: run a signed scientific reproduction contract in a sealed container.

Public API::

    from runner import run, verify, RunOptions, ResultEnvelope, RunnerError, VerifiedContract

(``verify`` returns a ``VerifiedContract``; ``runner.__version__`` is the version.) The
helpers for code that embeds the runner are in ``runner.testing``. Everything else is private
and may change: each module's ``__all__`` lists the names other modules of the runner may
import from it (tests/unit/test_exported_members.py holds them to it). The names are imported on
first use, so that ``runner --help`` and small commands do not pay for the whole package at
start-up.
"""

from __future__ import annotations

from runner._version import __version__

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from runner.contract import VerifiedContract
    from runner.core.errors import RunnerError
    from runner.execution.options import RunOptions
    from runner.execution.orchestrator import run
    from runner.models.envelope import ResultEnvelope

_LAZY = {
    "ResultEnvelope": "runner.models.envelope",
    "RunOptions": "runner.execution.options",
    "RunnerError": "runner.core.errors",
    "VerifiedContract": "runner.contract",
    "run": "runner.execution.orchestrator",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'runner' has no attribute {name!r}")


def verify(contract_path: str | Path) -> VerifiedContract:
    """Load and verify a contract (JSON, schema, digest, parser bindings); raise on refusal."""
    from pathlib import Path

    from runner.contract import load_contract

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
