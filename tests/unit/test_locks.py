"""The one ``flock(2)`` owner (:mod:`runner.core.locks`): a lock another process holds is seen
as held (refused at once, waited for up to a timeout, probed), and free again once it lets
go; a job directory's lock refuses a second runner with JobBusy. The other process is a real
one holding the kernel lock, not a stand-in."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.core import locks
from runner.core.errors import JobBusy
from runner.execution.sweeper import runner_alive
from runner.state.jobdir import JobDir
from tests.support.clock import VirtualClock

HOLD = """
import fcntl, sys
f = open(sys.argv[1], "a+")
fcntl.flock(f, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def _hold(path: Path) -> subprocess.Popen[str]:
    """Another process, holding the lock of ``path`` until :func:`_let_go`."""
    other = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert other.stdout is not None and other.stdout.readline() == "held\n"
    return other


def _let_go(other: subprocess.Popen[str]) -> None:
    assert other.stdin is not None
    other.stdin.close()
    other.wait(10)
    assert other.stdout is not None
    other.stdout.close()


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Path]:
    """A lock file another process holds until the test ends."""
    path = tmp_path / "x.lock"
    other = _hold(path)
    try:
        yield path
    finally:
        _let_go(other)


def test_a_lock_another_process_holds_is_held(held: Path, virtual_clock: VirtualClock) -> None:
    assert locks.is_held(held)
    assert locks.try_lock(held) is None
    with locks.flocked(held, wait=False) as got:
        assert not got
    assert virtual_clock.sleeps == []  # one try, no wait
    with locks.flocked(held, timeout=0.5, poll=0.05) as got:
        assert not got
    # tried every 0.05 s until the 0.5 s had passed (float sums: 10 or 11 polls)
    assert set(virtual_clock.sleeps) == {0.05} and len(virtual_clock.sleeps) in (10, 11)
    assert 0.5 - 1e-9 <= virtual_clock.elapsed <= 0.55 + 1e-9  # the timeout, at most a poll more


def test_a_free_lock_is_taken_and_let_go(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "x.lock"
    assert not locks.is_held(path)  # missing: no one holds it, and it is not made
    assert not path.exists()
    with locks.flocked(path) as got:
        assert got and path.exists()
        assert locks.is_held(path)  # another open of the file sees it held
    assert not locks.is_held(path)
    fd = locks.try_lock(path)
    assert fd is not None
    assert locks.is_held(path) and locks.try_lock(path) is None
    locks.release(fd)
    assert not locks.is_held(path)


def test_a_lock_is_waited_for_until_its_holder_lets_go(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    path = tmp_path / "x.lock"
    other = _hold(path)
    start = time.monotonic()  # the kernel's wait: real time
    threading.Timer(0.2, _let_go, [other]).start()
    with locks.flocked(path) as got:  # blocking
        assert got
    assert time.monotonic() - start >= 0.2
    other = _hold(path)

    def let_go_at_the_third_poll(_: float) -> None:
        if len(virtual_clock.sleeps) == 3:
            _let_go(other)

    virtual_clock.on_sleep = let_go_at_the_third_poll
    with locks.flocked(path, timeout=10, poll=0.05) as got:  # polling
        assert got
    assert virtual_clock.sleeps == [0.05] * 3  # taken at the first poll after it let go
    fd = locks.try_lock(path)
    assert fd is not None
    locks.release(fd)
    with pytest.raises(OSError):
        os.fstat(fd)  # released is closed


def test_without_following_links_a_link_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("")
    link = tmp_path / "link.lock"
    link.symlink_to(target)
    with pytest.raises(OSError):
        locks.try_lock(link, opener=lambda p: locks.open_lock_file(p, follow_links=False))
    fd = locks.try_lock(link)  # the default opener follows it
    assert fd is not None
    locks.release(fd)


def test_a_job_another_process_runs_is_busy(tmp_path: Path, virtual_clock: VirtualClock) -> None:
    job = JobDir(tmp_path / "job")
    job.record.mkdir(parents=True)
    assert not runner_alive(job.root)
    other = _hold(job.lock)
    try:
        assert runner_alive(job.root)
        with pytest.raises(JobBusy), job.locked():
            pass
    finally:
        _let_go(other)
    assert (
        2.0 - 1e-9 <= virtual_clock.elapsed <= 2.1 + 1e-9
    )  # an onlooker's probe waited out first: 2 s
    assert set(virtual_clock.sleeps) == {0.1}
    with job.locked():
        assert runner_alive(job.root)
    assert not runner_alive(job.root)
