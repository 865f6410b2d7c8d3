"""Fixtures shared by several unit test modules: ``no_spawn`` by RUNNER_AUTOSERVE's
(test_autoserve.py, test_hostile_autoserve.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def no_spawn(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Popen recorded, never run: these tests are about when a server is not started."""
    started: list[list[str]] = []

    def record(argv: list[str], **kwargs: object) -> None:
        started.append(argv)

    import subprocess

    monkeypatch.setattr(subprocess, "Popen", record)
    return started
