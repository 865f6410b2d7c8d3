"""Taking over a job whose attempt another host left in flight (a state folder on shared storage).

A runner that finds its job's last attempt unfinished asks this host's engine what became of
the container. When the attempt was started on another host (``runner.core.hostid``), no engine here
knows it; :func:`close` decides from the ledger alone, by a rule that never lets two containers
of one job run at once and never charges less than the attempt can have run. The rule rests on
what every runner does while it watches a container (``runner.execution.container``): it writes a
heartbeat every few seconds, removes its own container once it has gone one lease without
managing to, and stops at once when it finds the ledger written by someone else.
"""

from __future__ import annotations

from runner.core import clock
from runner.core.errors import JobBusy, JobFenced
from runner.execution.container import Progress
from runner.state.ledger import Attempt, Ledger

__all__ = ["close"]


def close(
    ledger: Ledger, last: Attempt, other: str, default_lease: float, job_id: str, progress: Progress
) -> None:
    """Close attempt ``last``, left in flight by a runner on host ``other``, whose engine this
    runner cannot ask. That runner removes its container once it has gone one lease without
    writing a heartbeat (``runner.execution.lease.Lease``), and at once when it finds the
    ledger written by someone else (``JobFenced``). So: wait until two leases have passed
    since the attempt's last event (anything written meanwhile means its runner is alive:
    refuse, as for a busy job), then charge it up to that event plus two leases, never past
    now (never less than it can have run), and record it ``interrupted`` (``how: host-lost``)."""
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
    since = max((clock.now() - evidence).total_seconds(), 0.0)
    charged = (last.seconds if last.last_beat_at else 0.0) + min(2 * lease, since)
    progress.stage(
        "recover", f"attempt {n} on host {other} is lost; charged {charged:.1f} s (to its last "
        f"heartbeat plus two leases of {lease:.0f} s); starting a new attempt here"
    )  # fmt: skip
    data = {
        "attempt": n,
        "exitCode": None,
        "oomKilled": False,
        "classification": "interrupted",
        "seconds": round(charged, 3),
        "how": "host-lost",
        "host": other,
    }
    ledger.append(f"attempt-{n}.finished", "attempt.finished", data)
