"""The tenth hostile review (the ended container removed in a thread while the evidence is
read, container.Removal): what it found, kept closed. No engine: the fake backend.

A job that fills the disk makes the runner's own writes after the attempt fail; a Ctrl-C or a
SIGTERM (a served client's cancel) may arrive while the runner waits for the removal. Neither
may leave the job's container behind."""

from __future__ import annotations

import errno
import signal
from pathlib import Path
from typing import Any

import pytest

from runner.backends.fake import FakeBackend, FakeJob
from runner.execution.container import Removal
from runner.state.jobdir import JobDir
from tests.support.clock import VirtualClock
from tests.unit.test_orchestrator_fake import (
    _contract,
    _image,
    _options,
    _run,
    _SlowRemoval,
    _writes,
)

pytestmark = pytest.mark.hostile


def test_a_budget_write_that_fails_still_removes_the_container(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, virtual_clock: VirtualClock
) -> None:
    """The removal starts where the runner removed the container before: right after its end
    is in the ledger, before the budget file is written (a full disk fails that write)."""
    fake = FakeBackend(jobs=FakeJob(work=_writes()))
    fake.add_image()

    real = JobDir.write_budget

    def full(self: JobDir, budget: Any, durable: bool = True) -> None:
        if durable:  # the one after the attempt (staging writes it before, not fsynced)
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, budget, durable=durable)

    monkeypatch.setattr(JobDir, "write_budget", full)
    env = _run(_contract(tmp_path, _image(fake)), _options(tmp_path), fake)
    assert env["status"] == "failed" and env["failure"]["stage"] == "container"
    assert fake.containers == {}
    assert [m for m, _ in fake.calls].count("remove") == 1


def test_a_ctrl_c_while_the_removal_is_waited_for_waits_for_it() -> None:
    """A real signal (SIGALRM here, raising KeyboardInterrupt as the CLI's SIGINT and SIGTERM
    handlers do) arriving while the runner waits for the removal: it is raised once the
    removal is done, never with the removal still in flight (a fork's os._exit would cut it).
    Python 3.11's Thread.join, interrupted so, gives a running thread up as stopped."""
    backend = _SlowRemoval()
    backend.after_go = 0.2

    def interrupt(signum: int, frame: Any) -> None:
        backend.go.set()  # the removal ends only once the interrupt is on its way
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGALRM, interrupt)
    try:
        removal = Removal(backend, "c1")
        removal.start()
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(KeyboardInterrupt):
            removal.wait()
        assert backend.removed == ["c1"]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
