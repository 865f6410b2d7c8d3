"""The Slurm batch step's own process (runner.scheduling.slurm.step): its child's exit code,
and after a child killed by a signal, the wait for the job's owner. Real child processes
(short Python one-liners), a real job lock, the virtual clock; no Slurm."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.scheduling.slurm import step
from runner.state.jobdir import StateDir
from tests.support.clock import VirtualClock


@pytest.fixture(autouse=True)
def _handlers() -> Iterator[None]:
    """The step installs its own SIGTERM, SIGINT and SIGHUP handlers: put pytest's back."""
    saved = {sig: signal.getsignal(sig) for sig in step.FORWARDED}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _main(state: Path, code: str) -> int:
    return step.main(["--state-dir", str(state), "--job-id", "j", "--", sys.executable, "-c", code])


def test_a_child_that_exits_gives_its_code(tmp_path: Path, virtual_clock: VirtualClock) -> None:
    assert _main(tmp_path, "raise SystemExit(3)") == 3
    assert _main(tmp_path, "pass") == 0
    assert virtual_clock.sleeps == [], "no wait after a child that exited by itself"


def test_a_killed_child_with_no_owner_ends_the_step_after_the_grace(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    code = _main(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert code == 128 + 9
    assert step.OWNER_GRACE_SECONDS <= sum(virtual_clock.sleeps) < step.OWNER_GRACE_SECONDS + 0.5


def test_a_killed_child_whose_job_a_runner_here_owns_waits_for_its_end(
    tmp_path: Path, virtual_clock: VirtualClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """A runner of this host (this test process) owns the job: the step stays, looking once
    a second, until the lock is free; the ledger does not say finished, so it exits 137."""
    job = StateDir(tmp_path).job("j")
    job.record.mkdir(parents=True)
    held = contextlib.ExitStack()
    held.enter_context(job.locked())

    def meanwhile(seconds: float) -> None:
        if len(virtual_clock.sleeps) == 5:
            held.close()

    virtual_clock.on_sleep = meanwhile
    try:
        code = _main(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    finally:
        held.close()
    assert code == 137
    assert virtual_clock.sleeps == [step.POLL_SECONDS] * 5, "one look a second, until it ended"
    assert "this batch step stays until it ends" in capsys.readouterr().err


def test_the_child_dies_with_a_step_killed_outright(tmp_path: Path) -> None:
    """A step SIGKILLed (Slurm's KillWait ran out) takes its `runner run` with it: before, the
    child lived on outside the allocation, out of Slurm's sight, and the Epilog took it for a
    live owner and left its container running (the two-node Epilog test found it)."""
    import os
    import subprocess
    import time

    code = "import os, time; print(os.getpid(), flush=True); time.sleep(120)"
    stepped = subprocess.Popen(
        [sys.executable, "-m", "runner.scheduling.slurm.step", "--state-dir", str(tmp_path),
         "--job-id", "j", "--", sys.executable, "-c", code],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert stepped.stdout is not None
    child = int(stepped.stdout.readline())
    stepped.kill()
    stepped.wait()
    deadline = time.monotonic() + 30  # the kernel's signal: at once; 30 s for a loaded host
    while True:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        try:  # a zombie not yet reaped by init is gone too
            with open(f"/proc/{child}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        assert time.monotonic() < deadline, "the step's child outlived it"
        time.sleep(0.05)
