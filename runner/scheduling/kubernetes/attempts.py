"""Each Kubernetes submission of a job as an attempt in its ledger (``record/ledger.jsonl``,
:class:`runner.state.ledger.Ledger`, the one writer `runner run` and its Slurm jobs use): one
budget, whichever runs the job.

`runner cluster submit --to kubernetes` appends ``attempt.starting`` (intent, before the Job is
created) and ``attempt.started`` (the Job's uid, after); `runner job status`, `wait` and
`cancel` append ``attempt.finished`` once they see the Job end, charged from the API server's
times by :func:`charge`. Every append is under the job's lock. Observing the same end again
appends nothing (the attempt is found by the Job's uid and is finished already).

The charging rule (:func:`charge`), with every time from the API server treated as hostile:

- a time counts only when it is RFC 3339 (``2026-12-01T10:00:00Z``, at most 64 characters)
  and lies between the attempt's ``attempt.starting`` (the runner's clock) less
  :data:`CLOCK_SKEW_SECONDS` and the moment the runner observed the end plus that skew; it is
  then clamped into that window without the skew;
- the start is the earliest such time of the pod's ``status.startTime`` and its container's
  ``state.terminated.startedAt`` / ``state.running.startedAt`` (the image pull included, as
  ``activeDeadlineSeconds`` counts it); with none, the attempt's ``attempt.starting``;
- the end is the container's ``state.terminated.finishedAt`` when it counts and is not before
  the start; otherwise (missing, malformed, in the future, before the start, a container not
  terminated, a pod deleted) the moment the runner observed the end, and the record says so
  (``endFrom: observed`` with the reason), and then the start is the submit too (an API start
  alone is not believed: a late one would charge a whole deadline's run about nothing);
- from two API times, one second is added (Kubernetes writes whole seconds, cut down), so a
  pod that claims 0 s is charged 1 s; the charge is never negative and never more than the wall
  time from ``attempt.starting`` to the observation;
- a Job (and its pods) gone before any end was seen is charged that wall time, at most its
  ``activeDeadlineSeconds`` plus the pod's termination grace (what the cluster lets it run);
- when the clocks disagree by more than that skew (the host that observes the end is behind
  the one that submitted, or any RFC 3339 time of the API server's lies outside that window),
  the wall time between two hosts' clocks means nothing: the charge is the more of the API
  server's own start to its end (one clock, plus the second) and that wall time, at most
  ``activeDeadlineSeconds`` plus the grace; with no such start and end, that cap itself. The
  record says why (``because``).

An API server that lies consistently (times both in the window, close together) can still make
an attempt look shorter than it ran: the runner has no clock in the pod. The
``activeDeadlineSeconds`` the Job carries (the budget left when it was submitted) is what bounds
one attempt then; docs/how-to/kubernetes.md states it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from runner.backends.types import engine_text
from runner.core import clock, untrusted
from runner.core.errors import JobBusy, ResourceExhausted
from runner.scheduling.kubernetes.render import STOP_GRACE_SECONDS
from runner.state.jobdir import JobDir
from runner.state.ledger import Attempt, Ledger, LedgerState, parse_time

__all__ = [
    "CLOCK_SKEW_SECONDS",
    "JOB_UID",
    "MAX_PODS",
    "Charge",
    "charge",
    "find",
    "is_kubernetes",
    "job_of",
    "job_uid",
    "owned_by",
    "record_end",
    "record_started",
    "refuse",
    "rfc3339",
    "server_text",
    "starting_data",
]

CLOCK_SKEW_SECONDS = 30.0
"""How far the API server's clock may be from the runner's before its times stop counting."""
MAX_PODS = 8
"""Pods of one Job looked at (``backoffLimit: 0`` makes one; a hostile list is cut)."""
KIND = "kubernetes"

_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")


JOB_UID = re.compile(r"[A-Za-z0-9][-A-Za-z0-9]{0,63}")
"""What a Job's uid is made of (a UUID's characters, at most 64)."""


def job_uid(value: Any) -> str | None:
    """A Job's uid as the API server gave it, when it is one (:data:`JOB_UID`), else None: it
    goes into the ledger, a label selector and a delete's precondition (a create's answer with
    a 64 MB uid had gone whole into the ledger, read again by every later command)."""
    return value if isinstance(value, str) and JOB_UID.fullmatch(value) else None


def is_kubernetes(a: Attempt) -> bool:
    """Whether the attempt is a Kubernetes Job's (its ``attempt.starting`` says so)."""
    return a.starting.get("to") == KIND


def job_of(a: Attempt) -> str:
    """``namespace/name`` of a Kubernetes attempt's Job."""
    return f"{a.starting.get('namespace')}/{a.starting.get('name')}"


def refuse(state: LedgerState | None, job_id: str, ledger_path: Path, limit: float) -> None:
    """Before rendering a job for the cluster: refuse one whose last Kubernetes attempt has no
    recorded end (``JobBusy``, naming the command that records it), and one with less than a
    second of budget left (``ResourceExhausted``, naming the ledger and what was used)."""
    if state is None or state.accepted is None:
        return
    last = state.in_flight
    if last is not None and is_kubernetes(last):
        raise JobBusy(
            f"job {job_id}: attempt {last.number} was submitted to Kubernetes (Job "
            f"{job_of(last)}) and its end is not recorded in the ledger {ledger_path}; "
            "submitting again could run it twice and would not know what it used",
            hint=f"`runner job status {job_id}` or `runner job wait {job_id}` (with the same "
            "--state-dir) asks the API server and records it once the Job has ended; "
            f"`runner job cancel {job_id}` ends it",
        )
    if state.finished is not None or state.in_flight is not None:
        return  # left_to_schedule refuses these, in `runner run`'s words
    used = state.budget(min(state.limit, limit))
    if used.remaining < 1:
        raise ResourceExhausted(
            f"job {job_id} has used {used.consumed:.1f} s of its {used.limit:.1f} s budget "
            f"in {len(state.attempts)} attempt(s) (ledger {ledger_path}); nothing is left to "
            "submit",
            hint=f"`runner job status {job_id}` shows where it went; a contract with a new "
            "budget needs a new job id",
        )


def rfc3339(value: Any) -> datetime | None:
    """An RFC 3339 time with its offset (what the API server writes), else None."""
    if not isinstance(value, str) or len(value) > 64 or not _RFC3339.fullmatch(value):
        return None
    parsed = parse_time(value.upper())
    return parsed if parsed is not None and parsed.tzinfo is not None else None


@dataclass(frozen=True)
class Charge:
    """What an attempt is charged, and from which times."""

    seconds: float
    start: datetime
    start_from: str
    """``api``: the API server's time; ``submitted``: the runner's ``attempt.starting``."""
    end: datetime
    end_from: str
    """``api``: the API server's time; ``observed``: when the runner saw the end."""
    why: str | None
    """Why the end is the observation (or the charge was capped), when it is."""

    def as_json(self) -> dict[str, Any]:
        def iso(t: datetime) -> str:
            return t.isoformat(timespec="microseconds").replace("+00:00", "Z")

        return {
            "start": iso(self.start),
            "startFrom": self.start_from,
            "end": iso(self.end),
            "endFrom": self.end_from,
            **({"because": self.why} if self.why else {}),
        }


def _container(pod: Any) -> dict[str, Any]:
    """The pod's ``job`` container status (else its first)."""
    found = [c for c in untrusted.array(untrusted.at(pod, "status", "containerStatuses"))
             if isinstance(c, dict)]  # fmt: skip
    named = [c for c in found if c.get("name") == "job"]
    return (named or found or [{}])[0]


def charge(
    *,
    submitted_at: datetime,
    observed_at: datetime,
    pods: list[Any],
    job: Any,
    deadline: float,
) -> Charge:
    """The seconds an attempt submitted at ``submitted_at`` (the runner's clock) and seen ended
    at ``observed_at`` is charged, from its ``pods`` and ``job`` as the API server answered
    (hostile), by the rule of this module's docstring. ``job`` None: the Job was gone."""
    skew = timedelta(seconds=CLOCK_SKEW_SECONDS)
    low, high = submitted_at - skew, observed_at + skew
    hosts_agree = observed_at >= low  # the observing host's clock not behind the submitting's
    observed_at = max(observed_at, submitted_at)
    wall = (observed_at - submitted_at).total_seconds()
    containers = [_container(p) for p in pods[:MAX_PODS]]
    if pods:
        start_values = [
            *(untrusted.at(p, "status", "startTime") for p in pods[:MAX_PODS]),
            *(untrusted.at(c, "state", "terminated", "startedAt") for c in containers),
            *(untrusted.at(c, "state", "running", "startedAt") for c in containers),
        ]
    else:  # the pods are gone: the Job's own start
        start_values = [untrusted.at(job, "status", "startTime")] if job is not None else []
    terminated = [untrusted.at(c, "state", "terminated") for c in containers]
    raw = [untrusted.at(t, "finishedAt") for t in terminated if isinstance(t, dict)]
    if not pods:
        raw = [untrusted.at(job, "status", "completionTime")] if job is not None else []
    api_starts = [t for t in map(rfc3339, start_values) if t is not None]
    api_ends = [t for t in map(rfc3339, raw) if t is not None]
    if not hosts_agree or any(not low <= t <= high for t in (*api_starts, *api_ends)):
        return _disagreeing(
            submitted_at, observed_at, api_starts, api_ends, deadline + STOP_GRACE_SECONDS
        )

    starts = [min(max(t, submitted_at), observed_at) for t in api_starts]
    start, start_from = (min(starts), "api") if starts else (submitted_at, "submitted")
    ends: list[datetime] = []
    why = None
    if not pods:
        why = "no pod of the Job was found (deleted before the end was observed)"
        ends = [t for t in (min(max(t, submitted_at), observed_at) for t in api_ends) if t >= start]
    elif not any(isinstance(t, dict) for t in terminated):
        why = "the container had not terminated"
    else:
        ends = [t for t in (min(max(t, submitted_at), observed_at) for t in api_ends) if t >= start]
        if not ends:
            said = ", ".join(repr(v)[:80] for v in raw)
            why = f"the container's finishedAt ({said}) is missing or does not count"
    if ends:
        end, end_from, why = max(ends), "api", None
        seconds = (end - start).total_seconds() + (1.0 if start_from == "api" else 0.0)
    else:
        # No end the API gives: its start alone is not believed either (a late startTime
        # would charge an attempt that ran its whole deadline about nothing): from the submit.
        start, start_from = submitted_at, "submitted"
        end, end_from = observed_at, "observed"
        seconds = (end - start).total_seconds()
    seconds = min(max(seconds, 0.0), wall)
    if job is None and not pods:  # gone unseen: as long as the cluster lets it run
        cap = deadline + STOP_GRACE_SECONDS
        if seconds > cap:
            seconds, why = cap, f"{why}; capped at activeDeadlineSeconds plus the grace period"
    return Charge(round(seconds, 3), start, start_from, end, end_from, why)


def _disagreeing(
    submitted_at: datetime,
    observed_at: datetime,
    api_starts: list[datetime],
    api_ends: list[datetime],
    cap: float,
) -> Charge:
    """The charge when the clocks disagree by more than :data:`CLOCK_SKEW_SECONDS`: the host
    that observed the end is behind the one that submitted, or an API time lies outside what
    they saw. Which clock is off is not known, so neither the wall time between the two hosts'
    times (an observer 10 minutes behind the submitter made every attempt 0 s) nor the API
    server's times alone are believed: the more of the two, the API server's from its own start
    to its own end (one clock) plus the second Kubernetes cuts, at most ``cap`` (what the
    cluster lets an attempt run: activeDeadlineSeconds and the grace period); with no such
    pair, the cap itself."""
    why = (
        "the clocks of the host that submitted the Job, the host that observed its end and "
        f"the API server disagree by more than {CLOCK_SKEW_SECONDS:g} s (keep them in time: "
        "NTP)"
    )
    if api_starts and api_ends and max(api_ends) >= min(api_starts):
        start, end = min(api_starts), max(api_ends)
        wall = (observed_at - submitted_at).total_seconds()
        seconds = min(max((end - start).total_seconds() + 1.0, wall), cap)
        why += (
            "; charged the more of the API server's own start to end and the wall time from "
            "the submit to the observation, at most activeDeadlineSeconds plus the grace"
        )
        return Charge(round(seconds, 3), start, "api", end, "api", why)
    why += "; no start and end from the API server: charged activeDeadlineSeconds plus the grace"
    return Charge(round(cap, 3), submitted_at, "submitted", observed_at, "observed", why)


def starting_data(
    n: int,
    *,
    name: str,
    namespace: str,
    context: str | None,
    kubeconfig: Path | None,
    deadline: int,
    image: str,
) -> dict[str, Any]:
    """``attempt.starting`` of a Kubernetes attempt. ``host`` names the Job (no host of the
    runner's runs it, so a `runner run` of the job treats it as another host's attempt and waits
    out its lease, ``leaseSeconds``: the most the cluster lets it run), ``image`` is the pinned
    reference (no engine here inspected it)."""
    return {
        "attempt": n,
        "containerName": f"{namespace}/{name}",
        "to": KIND,
        "namespace": namespace,
        "name": name,
        "context": context,
        "kubeconfig": str(kubeconfig) if kubeconfig is not None else None,
        "activeDeadlineSeconds": deadline,
        "leaseSeconds": deadline + STOP_GRACE_SECONDS,
        "host": {"name": f"{KIND}:{namespace}/{name}", "bootId": ""},
        "image": {"reference": image, "id": None, "repoDigest": image},
    }


def record_started(led: Ledger, n: int, uid: str) -> None:
    """``attempt.started`` of Kubernetes attempt ``n``: the uid of the Job that runs it (one
    :func:`job_uid` let through)."""
    if job_uid(uid) is None:
        raise ValueError(f"not a Job's uid: {uid[:80]!r}")
    led.append(f"attempt-{n}.started", "attempt.started", {"attempt": n, "containerId": uid})


def find(state: LedgerState, namespace: str, name: str, uid: str | None) -> Attempt | None:
    """The Kubernetes attempt of Job ``namespace/name`` with ``uid`` (None: the Job is gone):
    the attempt whose ``attempt.started`` recorded that uid, else the attempt in flight for
    that Job with no uid recorded yet (its submit stopped between create and record), else
    (``uid`` None) the attempt in flight for that Job."""
    mine = [
        a for a in state.attempts
        if is_kubernetes(a) and a.starting.get("namespace") == namespace
        and a.starting.get("name") == name
    ]  # fmt: skip
    if uid is not None:
        for a in mine:
            if a.container_id == uid:
                return a
    last = state.in_flight
    ours = last is not None and any(last is a for a in mine)
    if last is not None and ours and (uid is None or last.container_id is None):
        return last
    return None


def owned_by(pods: list[Any], uid: str | None) -> list[Any]:
    """The pods (as the API server listed them) whose ``ownerReferences`` name the Job of
    ``uid``: another's pod carrying its label is not its pod."""
    return [
        p for p in pods
        if isinstance(p, dict) and uid is not None
        and any(untrusted.at(o, "uid") == uid
                for o in untrusted.array(untrusted.at(p, "metadata", "ownerReferences")))
    ]  # fmt: skip


def server_text(value: Any, limit: int = 300) -> str | None:
    """An API server's reason or message, printable ASCII (each other character ``?``, runs
    of white space one space), cut to ``limit`` (:func:`runner.backends.types.engine_text`);
    None when it is no string."""
    if not isinstance(value, str):
        return None
    return engine_text(" ".join(value.split()), limit)


def record_end(
    job_dir: JobDir,
    *,
    namespace: str,
    name: str,
    job: Any,
    pods: Callable[[Attempt], list[Any] | str],
    ended: str,
    reason: Any = None,
) -> dict[str, Any]:
    """Record the end of the attempt that Job ``namespace/name`` (``job`` as the API server
    answered, None when gone) runs, seen as ``ended`` (``complete``, ``failed``,
    ``deadline_exceeded``, ``cancelled``, ``vanished``), under the job's lock. ``pods`` is
    asked, under the lock (so no submit of the job is half done), for the attempt's pods as
    the API server answers now, or why not to record it (a gone Job that is back, or whose pod
    still runs). What was recorded: ``recorded`` is ``now``, ``already`` (nothing appended) or
    None (with ``why``; nothing appended)."""
    uid = job_uid(untrusted.at(job, "metadata", "uid")) if job is not None else None
    with job_dir.locked():
        led = Ledger.open(job_dir.ledger)
        a = find(led.state, namespace, name, uid)
        if a is None:
            return {"recorded": None, "ledger": str(job_dir.ledger),
                    "why": f"no attempt of Job {namespace}/{name} in the ledger"}  # fmt: skip
        if a.finished is not None:
            return {"recorded": "already", "attempt": a.number, "seconds": a.seconds,
                    "ledger": str(job_dir.ledger)}  # fmt: skip
        n = a.number
        found = pods(a)
        if isinstance(found, str):
            return {"recorded": None, "attempt": n, "ledger": str(job_dir.ledger), "why": found}
        if a.container_id is None and uid is not None:
            record_started(led, n, uid)
        mine = a.container_id or uid
        owned = owned_by(found, mine)
        deadline = a.starting.get("activeDeadlineSeconds")
        got = charge(
            submitted_at=a.starting_at,
            observed_at=clock.now(),
            pods=owned,
            job=job,
            deadline=float(deadline) if isinstance(deadline, int | float) else 0.0,
        )
        pod = owned[0] if owned else None
        data = {
            "attempt": n,
            "exitCode": None,
            "oomKilled": False,
            # Never a final classification: the API server's word is no evidence the runner
            # observed, and `runner run` would read a final one back as the job's end.
            "classification": "cancelled" if ended == "cancelled" else "unverified",
            "seconds": got.seconds,
            "how": f"kubernetes-{ended}",
            "kubernetesJob": f"{namespace}/{name}",
            "jobUid": mine,
            "podUid": server_text(untrusted.at(pod, "metadata", "uid"), 64),
            "reason": server_text(reason),
            **got.as_json(),
        }
        led.append(f"attempt-{n}.finished", "attempt.finished", data)
    return {"recorded": "now", "attempt": n, "seconds": got.seconds,
            "ledger": str(job_dir.ledger), **got.as_json()}  # fmt: skip
