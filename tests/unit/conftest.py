"""Fixtures shared by several unit test modules: ``no_spawn`` by RUNNER_AUTOSERVE's
(test_autoserve.py, test_hostile_autoserve.py), ``short_dir`` by the engine client's
(test_engine_wait.py, test_hostile_review_round6.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.engine_socket import short_folder


@pytest.fixture
def no_spawn(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Popen recorded, never run: these tests are about when a server is not started."""
    started: list[list[str]] = []

    def record(argv: list[str], **kwargs: object) -> None:
        started.append(argv)

    import subprocess

    monkeypatch.setattr(subprocess, "Popen", record)
    return started


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: a Unix socket's path is at most 107 bytes."""
    with short_folder() as folder:
        yield folder
