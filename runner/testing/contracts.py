"""Contracts for tests and benchmarks, written from the toy example of a source checkout
(``examples/toy-evaluation``: the examples are not in the wheel)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.contract import with_digest

__all__ = [
    "EXAMPLES",
    "IMAGE",
    "TOY",
    "copy_toy_inputs",
    "json_measurement",
    "toy_data",
    "write_contract",
]

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
"""The checkout's examples folder (beside runner/)."""
TOY = EXAMPLES / "toy-evaluation"
IMAGE = "runner-cpu:local"
"""The job image scripts/setup.sh builds."""


def toy_data() -> dict[str, Any]:
    """The toy contract's data, as the example has it."""
    data: dict[str, Any] = json.loads((TOY / "task.json").read_text())
    return data


def copy_toy_inputs(folder: Path) -> Path:
    """The toy's paper and repository, copied into ``folder`` (for a contract written there
    that `runner sign` binds to them); ``folder``."""
    shutil.copytree(TOY / "repository", folder / "repository", dirs_exist_ok=True)
    shutil.copy(TOY / "paper.md", folder / "paper.md")
    return folder


def write_contract(
    folder: Path,
    image: str,
    *,
    command: list[str] | None = None,
    environment: dict[str, Any] | None = None,
    protocol: dict[str, Any] | None = None,
    measurements: list[dict[str, Any]] | None = None,
    with_inputs: bool = True,
    change: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """A contract in ``folder`` based on the toy one, pinned to ``image`` and re-digested;
    ``change`` edits the contract's data last."""
    data = toy_data()
    if with_inputs:
        copy_toy_inputs(folder)
    else:
        data.pop("paper")
        data.pop("repository")
    data["environment"]["image"] = image
    data["environment"].update(environment or {})
    if command is not None:
        data["protocol"]["command"] = command
        data["protocol"]["requiredCommandFragments"] = []
    data["protocol"].update(protocol or {})
    if measurements is not None:
        data["measurements"] = measurements
    if change is not None:
        change(data)
    path = folder / "task.json"
    path.write_text(json.dumps(with_digest(data), indent=2))
    return path


def json_measurement(
    path: str, pointer: str = "/accuracy", mid: str = "m", metric: str = "accuracy"
) -> dict[str, Any]:
    """A measurement read by json.scalar from ``path`` (relative to /job/output)."""
    return {
        "measurementId": mid,
        "metric": metric,
        "unit": "fraction",
        "parser": {
            "id": "json.scalar",
            "version": "1",
            "evidencePath": path,
            "config": {"pointer": pointer},
        },
    }
