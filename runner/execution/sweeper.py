"""``runner cleanup``: remove containers this runner left behind, never one a job still needs.

A container is removed when the job's ledger says its attempt has finished (or the job has),
whoever holds the job now (a runner on another host may have taken it over), and when its
attempt is not in the ledger and no runner holds the job's lock. One whose ledger says it is
still running is listed and left alone: `runner run` on that job reattaches to it. With
``orphans`` (what a Slurm Epilog runs: the job's next runner may be on another host, which
cannot reach this engine) it is stopped instead, under the job's lock, its end recorded in the
ledger from the engine (``interrupted``, ``how: orphan-stopped``, charged from its last
heartbeat to its end), its egress lease ended, and then removed. A container whose job's lock
a live runner of this host holds (a served runner whose client died) is kept and is no
failure (:data:`WATCHED`); one whose job a runner of another host holds (a takeover waiting
for this node's Slurm job to end) is stopped and removed without the lock, the attempt left
for that runner to charge (:data:`HELD_ELSEWHERE`). The egress allowlist's slots
(network, proxy, namespace holder; see :mod:`runner.egress.slots`) outlive attempts on purpose: each
free one (no runner holds its lock, no job container is in it) is removed, however recently
used.

Everything it looks at is one state folder's: containers and networks whose job folder
(``org.runner.job-dir``) lies under its ``jobs/``, slots labelled with it
(:data:`runner.egress.slots.STATE`). What another state folder made, or what carries no such label
(a slot made before the label), is neither touched nor listed. With ``labels`` and no state
folder (what the Slurm Epilog runs, as root, knowing the Slurm job but not its state folder)
the containers carrying those labels are looked at whatever their state folder, and no
network or slot.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from runner.backends.base import Backend, ContainerSummary
from runner.core import locks
from runner.core.errors import ContainerVanished, JobBusy, JobFenced, RunnerError
from runner.egress import slots as egress
from runner.execution import container
from runner.state import ledger
from runner.state.jobdir import JobDir, StateDir

__all__ = ["HELD_ELSEWHERE", "WATCHED", "runner_alive", "sweep"]

STILL_RUNS = "its ledger says it still runs; `runner run` on the job reattaches to it"
HELD_ELSEWHERE = "its attempt is in flight but the job is held by a runner on host"
"""Why a container is kept when the job's lock is held by a runner of another host (the
state folder's storage shares the lock): no runner here watches it. With ``orphans`` it is
stopped and removed without the lock and without a ledger record; that runner, taking the
job over, charges the attempt."""
WATCHED = "a live runner on this host owns its job and watches it"
"""Why a container is kept when the job's lock is held by a process of this host that
``record/owner.json`` names (:meth:`JobDir.owner_pid`): with ``orphans``, no failure (an
Epilog succeeds: the job is healthy, its runner enforces its budget). A lock held by anyone
else (another host, a process owner.json does not name) is kept as ``a runner is watching
it``, which with ``orphans`` is a failure: no one here can vouch for the container."""


def runner_alive(job_root: Path) -> bool:
    """Whether a runner holds the job's lock right now."""
    return locks.is_held(JobDir(job_root).lock)


def _verdict(labels: dict[str, str]) -> tuple[bool, str]:
    """(remove?, why) for a container or network carrying these labels."""
    job_dir = labels.get("org.runner.job-dir")
    if not job_dir or not Path(job_dir).is_dir():
        return False, f"its job folder {job_dir or '(unlabelled)'} is not here; remove it by hand"
    root = Path(job_dir)
    path = JobDir(root).ledger
    if not path.exists():
        return False, "its job has no ledger; remove it by hand"
    state = ledger.read_state(path)
    attempt = int(labels.get("org.runner.attempt", "0") or 0)
    mine = state.attempt(attempt)
    if mine is not None and (mine.finished is not None or state.finished is not None):
        # Ended in the ledger, whoever holds the job now (a runner on another host that took
        # it over, say): a container of an ended attempt never runs on.
        return True, "its attempt has finished in the ledger"
    if runner_alive(root):
        owner = JobDir(root).owner_pid()
        if owner is not None:
            return False, f"{WATCHED} (pid {owner})"
        if mine is not None and (other := JobDir(root).owner_elsewhere()) is not None:
            return False, f"{HELD_ELSEWHERE} {other}"
        return False, "a runner is watching it"
    if mine is None:
        return True, "its attempt is not in the ledger and no runner watches it"
    return False, STILL_RUNS


def _stop_orphan(backend: Backend, c: ContainerSummary, grace: float) -> str:
    """Stop an in-flight attempt's container that no runner watches and record its end; why,
    as the report says it. Under the job's lock, so no runner starts meanwhile."""
    root = JobDir(Path(c.labels["org.runner.job-dir"]))
    n = int(c.labels.get("org.runner.attempt", "0") or 0)
    with root.locked():
        led = ledger.Ledger.open(root.ledger)
        mine = led.state.in_flight
        if mine is None or mine.number != n or mine.container_name != c.name:
            return "its attempt has finished and no runner watches it"
        with contextlib.suppress(ContainerVanished):  # gone meanwhile: charged until now
            backend.stop(c.id, grace)
        found = container.recover(backend, mine)
        if found.state is not None:  # its final state and engine log, as a runner keeps them
            watched = container.Watched(False, False, found.seconds, None)
            container.finish(backend, c.id, c.name, root.attempt_record(n), watched=watched)
        data = {
            "attempt": n,
            "exitCode": None,
            "oomKilled": False,
            "classification": "interrupted",
            "seconds": round(found.seconds, 3),
            "how": "orphan-stopped",
        }
        led.append(f"attempt-{n}.finished", "attempt.finished", data)
        started = mine.starting.get("egress")
        if started and "slot" in started:
            eg = egress.Egress.from_json(started)
            egress.down(backend, eg, root.attempt_record(n), root.root)
    return (
        f"no runner watched it: stopped, attempt {n} recorded interrupted ({found.seconds:.1f} s)"
    )


def _of_state(labels: dict[str, str], jobs: Path | None) -> bool:
    """Whether a container or network is of the state folder whose ``jobs/`` is ``jobs``
    (None: of any)."""
    if jobs is None:
        return True
    job_dir = labels.get("org.runner.job-dir")
    return job_dir is not None and job_dir != "" and Path(job_dir).parent == jobs


def sweep(
    backend: Backend | None = None,
    *,
    state_dir: Path | None,
    dry_run: bool = False,
    orphans: bool = False,
    labels: dict[str, str] | None = None,
    grace: float = 5.0,
) -> dict[str, Any]:
    """Remove what the module docstring says, of the state folder ``state_dir`` (None: only
    with ``labels``, of any); only containers carrying ``labels`` when given (and then no
    network or egress slot). The report's ``removed`` (with ``dry_run``: ``wouldRemove``,
    nothing removed) and ``kept`` list each thing with why."""
    if state_dir is None and not labels:
        raise ValueError("sweep: a state folder, or labels to look for")
    if backend is None:
        from runner import backends

        backend = backends.default()
    jobs = StateDir(state_dir).jobs.resolve() if state_dir is not None else None
    removed: list[dict[str, str]] = []
    kept: list[dict[str, str]] = []
    for c in backend.find({"org.runner.managed": "true", **(labels or {})}):
        if not _of_state(c.labels, jobs):
            continue
        remove, why = _verdict(c.labels)
        if not remove and why.startswith(HELD_ELSEWHERE) and orphans:
            if dry_run:
                remove, why = True, f"{why}: it would be stopped (that runner charges it)"
            else:
                with contextlib.suppress(ContainerVanished):
                    backend.stop(c.id, grace)
                remove, why = True, f"{why}: stopped (that runner charges its attempt)"
        elif not remove and why == STILL_RUNS and orphans:
            if dry_run:
                remove, why = True, "no runner watches it: it would be stopped and recorded"
            else:
                try:
                    remove, why = True, _stop_orphan(backend, c, grace)
                except JobFenced:
                    why = "its ledger changed while cleanup stopped it: look again"
                except JobBusy:
                    why = "a runner is watching it"
        item = {"id": c.id, "name": c.name, "status": c.status, "why": why}
        if remove:
            if not dry_run:
                backend.remove(c.id)
            removed.append(item)
        else:
            kept.append(item)
    if labels or state_dir is None:
        return _report(state_dir, dry_run, removed, kept)
    for n in backend.find_networks({"org.runner.managed": "true"}):
        if not _of_state(n.labels, jobs):
            continue
        remove, why = _verdict(n.labels)
        item = {"id": n.id, "name": n.name, "status": "network", "why": why}
        if remove and not dry_run:
            try:
                backend.remove_network(n.name)
            except RunnerError as exc:  # a container not ours is still on it
                remove, item["why"] = False, f"it could not be removed: {exc.message}"
        (removed if remove else kept).append(item)
    for slot in egress.reap(backend, idle_seconds=0.0, dry_run=dry_run, state_dir=state_dir):
        why = "a free egress slot of this state folder (its network, proxy and holder)"
        removed.append({"id": slot, "name": slot, "status": "egress slot", "why": why})
    return _report(state_dir, dry_run, removed, kept)


def _report(
    state_dir: Path | None,
    dry_run: bool,
    removed: list[dict[str, str]],
    kept: list[dict[str, str]],
) -> dict[str, Any]:
    done = "wouldRemove" if dry_run else "removed"
    state = str(state_dir.resolve()) if state_dir is not None else None
    return {"stateDir": state, "dryRun": dry_run, done: removed, "kept": kept}
