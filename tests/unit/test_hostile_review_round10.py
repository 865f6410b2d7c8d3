"""The tenth hostile review (the ended container removed in a thread while the evidence is
read, container.Removal), and what its gate found: kept closed. No engine: the fake backend.

A job that fills the disk makes the runner's own writes after the attempt fail; a Ctrl-C or a
SIGTERM (a served client's cancel) may arrive while the runner waits for the removal, or while
it appends to the ledger. None of them may leave the job's container behind."""

from __future__ import annotations

import errno
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from runner.app import host
from runner.backends.fake import FakeBackend, FakeJob
from runner.core import interrupts
from runner.execution.container import Removal
from runner.state.jobdir import JobDir
from runner.state.ledger import Ledger
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


def test_a_ctrl_c_during_a_ledger_append_is_raised_once_the_ledger_knows_its_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the gate (test_restarts' Ctrl-C right after a reattached runner's heartbeat):
    SIGINT landing in a heartbeat's append after the line was written, before the ledger's
    own account of it, made the runner's next append take its own event for another
    runner's (JobFenced, "another host took the job over"): it wrote nothing more and left
    its container running. The runner's handlers now hold the interrupt until the append is
    whole (runner.core.interrupts); a real SIGINT is sent from inside the append here."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    ledger.append(
        "job.accepted", "job.accepted", {"contractDigest": "sha256:x", "limitSeconds": 60}
    )
    real_fsync = os.fsync
    sent: list[int] = []

    def fsync_then_ctrl_c(fd: int) -> None:
        real_fsync(fd)
        if not sent:  # the line is on disk; the append is not over
            sent.append(fd)
            signal.raise_signal(signal.SIGINT)

    try:
        host.install_signal_handlers()
        monkeypatch.setattr(os, "fsync", fsync_then_ctrl_c)
        with pytest.raises(KeyboardInterrupt):
            ledger.append(
                "attempt-1.starting", "attempt.starting", {"attempt": 1, "containerName": "c1"}
            )
        monkeypatch.undo()
        assert sent
        # The runner goes on to record the attempt's end as its own.
        ledger.append("attempt-1.started", "attempt.started", {"attempt": 1, "containerId": "i"})
        assert [e.type for e in Ledger.open(ledger.path).events] == [
            "job.accepted",
            "attempt.starting",
            "attempt.started",
        ]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_an_interrupt_outside_a_deferred_block_is_raised_at_once_and_inside_at_its_end() -> None:
    with pytest.raises(KeyboardInterrupt):
        interrupts.interrupt()
    done: list[str] = []
    with pytest.raises(KeyboardInterrupt), interrupts.deferred():
        with interrupts.deferred():
            interrupts.interrupt()
            done.append("inner")
        done.append("outer")  # the inner block's end does not raise it: the outer's does
    assert done == ["inner", "outer"]
    with interrupts.deferred():  # nothing held over from the block before
        pass


def test_a_block_in_another_thread_holds_no_interrupt_of_the_main_thread() -> None:
    """Signal handlers run in the main thread: a deferred block another thread is in must not
    hold the main thread's interrupt (it would be raised in that thread, or never)."""
    inside, leave = threading.Event(), threading.Event()

    def worker() -> None:
        with interrupts.deferred():
            inside.set()
            assert leave.wait(30)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert inside.wait(30)
        with pytest.raises(KeyboardInterrupt):
            interrupts.interrupt()
    finally:
        leave.set()
        thread.join(30)
