"""Taking over a job whose attempt another host left in flight (a state folder on shared storage).

A runner that finds its job's last attempt unfinished asks this host's engine what became of
the container. When the attempt was started on another host (``runner.core.hostid``), no engine here
knows it; :func:`close` decides from the ledger alone, by a rule that never lets two containers
of one job run at once and never charges less than the attempt can have run. The rule rests on
what every runner does while it watches a container (``runner.execution.container``): it writes a
heartbeat every few seconds, removes its own container once it has gone one lease without
managing to, and stops at once when it finds the ledger written by someone else.

Under a cluster scheduler the rule does not stand alone (:func:`fence`): an attempt started in
a Slurm job records that job (``slurm`` in ``attempt.starting``), and before the takeover
charges it, the runner asks the scheduler (the :class:`Scheduler` seam; Slurm's is
``runner.scheduling.slurm.fence.SlurmFence``) whether that job still runs; one that does is
cancelled, and the takeover waits (at most :meth:`Scheduler.end_wait_seconds`) for Slurm to
say it has ended, its Epilog included, before a new attempt starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from runner.core import clock
from runner.core.errors import JobBusy, JobFenced
from runner.execution.container import Progress
from runner.state.ledger import Attempt, Ledger

__all__ = ["FENCE_POLL_SECONDS", "Scheduler", "close", "fence"]

FENCE_POLL_SECONDS = 1.0
"""How often the takeover asks whether a cancelled job has ended."""


class Scheduler(Protocol):
    """What a takeover asks the cluster scheduler about the job an earlier attempt ran in."""

    def job(self, job_id: str) -> tuple[str, bool] | None:
        """The job's state as the scheduler names it and whether it has ended (its Epilog
        included); None when the scheduler cannot tell (not installed, not answering, no
        longer knows the job)."""
        ...

    def cancel(self, job_id: str) -> None:
        """Ask the scheduler to end the job (a failure raises)."""
        ...

    def end_wait_seconds(self) -> float:
        """How long a cancelled job may take to end: its processes' SIGTERM to SIGKILL and
        its Epilog."""
        ...


def _slurm_id(value: Any) -> str | None:
    ok = isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20
    return value if ok else None


def fence(
    last: Attempt,
    scheduler: Scheduler | None,
    own: Mapping[str, Any] | None,
    job_id: str,
    progress: Progress,
) -> dict[str, Any] | None:
    """Ask the scheduler whether attempt ``last``'s job still runs and, when it does, have it
    cancelled and wait for its end; what was learnt (``slurm`` in the attempt's end), or None
    when the attempt recorded no job or no scheduler is at hand (the lease rule alone).

    - the attempt ran in this very Slurm job (``own``: a requeue): Slurm ended that run before
      it started this one, so there is nothing to cancel (``state: "requeued"``);
    - the scheduler cannot tell: the lease rule alone (``state: "unknown"``);
    - the job has ended: nothing to cancel;
    - the job has not ended (pending, held, running, completing): it is cancelled, and the
      takeover waits until the scheduler says it has ended (``cancelled: true``), at most
      :meth:`Scheduler.end_wait_seconds`; past that it refuses (JobBusy), writing nothing."""
    rec = last.starting.get("slurm")
    slurm = _slurm_id(rec.get("jobId")) if isinstance(rec, Mapping) else None
    if slurm is None or scheduler is None:
        return None
    n = last.number
    found: dict[str, Any] = {"jobId": slurm, "cancelled": False}
    if own is not None and own.get("jobId") == slurm:
        return {**found, "state": "requeued"}
    first = scheduler.job(slurm)
    if first is None:
        progress.stage(
            "recover", f"Slurm cannot tell whether attempt {n}'s job {slurm} still runs: "
            "the lease rule alone"
        )  # fmt: skip
        return {**found, "state": "unknown"}
    state, ended = first
    if ended:
        return {**found, "state": state}
    limit = scheduler.end_wait_seconds()
    progress.stage(
        "recover", f"attempt {n}'s Slurm job {slurm} is still {state}: cancelling it and "
        f"waiting up to {limit:.0f} s for its end"
    )  # fmt: skip
    scheduler.cancel(slurm)
    deadline = clock.monotonic() + limit
    while True:
        clock.sleep(FENCE_POLL_SECONDS)
        now = scheduler.job(slurm)
        if now is not None and now[1]:
            return {**found, "state": now[0], "cancelled": True, "was": state}
        if clock.monotonic() >= deadline:
            said = now[0] if now is not None else "unknown"
            raise JobBusy(
                f"job {job_id}: its attempt {n}'s Slurm job {slurm} did not end within "
                f"{limit:.0f} s of being cancelled (Slurm says {said}); not taken over, so "
                "that no two containers of the job run at once",
                hint=f"look at `scontrol show job {slurm}` and its node; run the contract "
                "again once it has ended",
            )


def close(
    ledger: Ledger,
    last: Attempt,
    other: str,
    default_lease: float,
    job_id: str,
    progress: Progress,
    *,
    scheduler: Scheduler | None = None,
    own: Mapping[str, Any] | None = None,
) -> None:
    """Close attempt ``last``, left in flight by a runner on host ``other``, whose engine this
    runner cannot ask. That runner removes its container once it has gone one lease without
    writing a heartbeat (``runner.execution.lease.Lease``), and at once when it finds the
    ledger written by someone else (``JobFenced``). So: wait until two leases have passed
    since the attempt's last event (anything written meanwhile means its runner is alive:
    refuse, as for a busy job), then charge it up to that event plus two leases, never past
    now (never less than it can have run), and record it ``interrupted`` (``how:
    host-lost``). Before it charges, the
    scheduler is asked about the attempt's job (:func:`fence`); a job it had to cancel ran
    until moments ago, so that attempt is charged to now; one whose end its own runner or the
    Epilog recorded meanwhile is left as they recorded it."""
    n = last.number
    lease = float(last.starting.get("leaseSeconds") or default_lease)  # its runner's lease
    evidence = last.last_beat_at or last.started_at or last.starting_at
    quiet = (clock.now() - evidence).total_seconds()
    if quiet < 2 * lease:
        progress.stage(
            "recover",
            f"attempt {n} runs on host {other} (last heartbeat {quiet:.0f} s ago); waiting "
            f"{2 * lease - quiet:.0f} s for its lease to run out",
        )
        clock.sleep(2 * lease - quiet)
        try:
            ledger.check_owned()
        except JobFenced:
            raise JobBusy(
                f"job {job_id} is being run on host {other}: its attempt {n} wrote to "
                "the ledger while this runner waited for its lease to run out",
                hint="wait for it to end (`runner status` shows it), or cancel it there",
            ) from None
    fenced = fence(last, scheduler, own, job_id, progress)
    if fenced is not None and fenced["cancelled"]:
        try:
            ledger.check_owned()
        except JobFenced:  # its runner (on SIGTERM) or the Epilog recorded its end
            ledger.reload()
            now = ledger.state.attempt(n)
            if now is not None and now.finished is not None:
                progress.stage("recover", f"attempt {n} ended as its Slurm job did; recorded")
                return
            raise JobBusy(
                f"job {job_id}: its ledger was written while this runner waited for attempt "
                f"{n}'s Slurm job {fenced['jobId']} to end",
                hint="run the contract again: the job's ledger says what happened",
            ) from None
    since = max((clock.now() - evidence).total_seconds(), 0.0)
    beats = last.seconds if last.last_beat_at else 0.0
    if fenced is not None and fenced["cancelled"]:
        charged = beats + since  # it ran until Slurm ended it, a moment ago
        how = f"to now: its Slurm job {fenced['jobId']} ran until it was cancelled"
    else:
        charged = beats + min(2 * lease, since)
        how = f"to its last heartbeat plus two leases of {lease:.0f} s"
    progress.stage(
        "recover", f"attempt {n} on host {other} is lost; charged {charged:.1f} s ({how}); "
        "starting a new attempt here"
    )  # fmt: skip
    data = {
        "attempt": n,
        "exitCode": None,
        "oomKilled": False,
        "classification": "interrupted",
        "seconds": round(charged, 3),
        "how": "host-lost",
        "host": other,
        **({"slurm": fenced} if fenced is not None else {}),
    }
    ledger.append(f"attempt-{n}.finished", "attempt.finished", data)
