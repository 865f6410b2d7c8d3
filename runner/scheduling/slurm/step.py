"""The Slurm batch step's own process: it starts `runner run` and stays until the job has ended.

`runner run` in a batch step may be a client of a ``runner serve`` on the node
(runner/client.py): the job then runs in a process forked from the server, outside the
step. When the client dies (``kill -9``, the OOM killer) that runner goes on, as a served one
does; were the client the step's only process, the step would end with it, Slurm would free
the allocation and run the Epilog while the job still ran, and `runner job wait` would see a
Slurm job without an envelope. So the batch script ``exec``s this instead::

    python -m runner.scheduling.slurm.step --state-dir S --job-id J -- python -m runner run ...

It runs the command as its child (standard streams shared: the envelope still goes where the
script sends it) and passes SIGTERM, SIGINT and SIGHUP on to it. When the child ends by a
signal while a runner on this node still holds the job's lock (``record/lock``, its owner
named in ``record/owner.json``: :meth:`runner.state.jobdir.JobDir.owner_pid`; looked for
during :data:`OWNER_GRACE_SECONDS`), it waits, one look every :data:`POLL_SECONDS`, until the
lock is free, and passes later signals to that owner
(Slurm's SIGTERM on `runner job cancel` or the time limit stops the job as it would have
stopped the client's). It exits with the child's code; after a dead child, 0 when the job's
ledger says it finished and ``128 + signal`` otherwise.

A child that exits by itself is never waited after (a JobBusy refusal because another runner
holds the job is that runner's business, not this step's). The child dies with the step
(``PR_SET_PDEATHSIG``, SIGKILL): a step killed outright (SIGKILL at the end of Slurm's
KillWait) leaves no `runner run` behind outside the allocation, where Slurm's process tracking
no longer sees it and the Epilog would take it for a live owner and leave its container.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from runner.core import clock

__all__ = ["OWNER_GRACE_SECONDS", "POLL_SECONDS", "main"]

POLL_SECONDS = 1.0
"""How often the step looks whether the job's owner still holds its lock."""
OWNER_GRACE_SECONDS = 2.0
"""How long, after the child died by a signal, the step looks for an owner before it ends: a
served runner whose client died just as it took the job's lock has it by then (one that had
not taken it when it saw its client go cancels the job: runner.app.server)."""
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _dies_with(parent: int) -> Callable[[], None]:
    """For the child, between fork and exec: SIGKILL when ``parent`` (this step) dies, and
    an exit at once when it died already (before the request took)."""

    def arm() -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != parent:
            os._exit(137)

    return arm


_PR_SET_PDEATHSIG = 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.scheduling.slurm.step")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--job-id", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("the command to run comes after --")
    child = subprocess.Popen(command, preexec_fn=_dies_with(os.getpid()))
    target: list[int] = [child.pid]  # who gets a signal passed on: the child, then the owner

    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            os.kill(target[0], signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    code = child.wait()
    if code >= 0:
        return code
    # Only now: the job folder's module brings pydantic with the ledger (about 0.1 s of CPU
    # in every Slurm job, where the step only waits for its child).
    from runner.state.jobdir import StateDir

    job = StateDir(Path(args.state_dir)).job(args.job_id)
    owner = job.owner_pid()
    grace = clock.monotonic() + OWNER_GRACE_SECONDS
    while owner is None and clock.monotonic() < grace:  # a served runner taking the lock now
        clock.sleep(0.1)
        owner = job.owner_pid()
    said = False
    while owner is not None and owner != child.pid:
        target[0] = owner
        if not said:
            print(
                f"runner: `runner run` ended by signal {-code}, but the runner that owns job "
                f"{args.job_id} (pid {owner}, a served one) runs on: this batch step stays "
                "until it ends",
                file=sys.stderr,
                flush=True,
            )
            said = True
        clock.sleep(POLL_SECONDS)
        owner = job.owner_pid()
    from runner.state.ledger import read_state

    try:
        finished = job.ledger.is_file() and read_state(job.ledger).finished is not None
    except Exception:  # noqa: BLE001 - a ledger that cannot be read: not finished
        finished = False
    return 0 if said and finished else 128 - code


if __name__ == "__main__":
    sys.exit(main())
