"""``runner job wait JOB…``: wait for jobs queued by `runner cluster submit` to end, and exit
as `runner run` would have for their envelopes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.app import host
from runner.cli._common import EXIT_INFRASTRUCTURE, batch_exit, usage
from runner.core import clock

if TYPE_CHECKING:
    from runner.cli._common import Subparsers
    from runner.scheduling.slurm.cluster import Cluster, Ended

__all__ = ["kube_args", "register", "where"]

SLURM_END_GRACE_SECONDS = 30
"""How long `runner job wait` waits for a Slurm job to end once its ledger says finished."""
FAILED_POLLS = 10
"""Looks in a row that may fail (Slurm or the API server not answering) before `runner job wait`
gives up with that failure."""

EPILOG = """\
A job has ended when its ledger says job.finished (its result.json is the envelope), or when
its Slurm job has ended (scontrol show job, else sacct, else Slurm's jobcomp file): then the
envelope is the one its `runner run` wrote to <state>/slurm/<job id>/envelope-<Slurm id>.json.
A Slurm job that ended without an envelope is an infrastructure failure naming its Slurm state
and log file; one cancelled before its runner started counts as cancelled. A Kubernetes Job
has ended when the API server's conditions say so; its attempt's end is then recorded in the
job's ledger (once), charged from the pod's times (docs/how-to/kubernetes.md).

exit codes (several jobs: the first of 130, 4, 3, 1, 0 that any job ended in):
  0    succeeded          1    the job failed, or its budget is spent
  3    refused on the node (policy, the allocation, the contract)
  4    infrastructure, no envelope, or --timeout passed first
  5    no such job submitted from this state folder
  130  cancelled (runner job cancel, scancel, or Slurm's time limit)

  runner job wait toy-checkpoint-evaluation-2e188735eb89 --state-dir /shared/runner
"""


def register(sub: Subparsers, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="Wait until each job queued by `runner cluster submit` has ended; print a\n"
        "line per job as it ends (with --json, one JSON array at the end).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "job", metavar="JOB", nargs="+", help="job id, as `runner cluster submit` printed it"
    )
    p.add_argument(
        "--state-dir", metavar="DIR", help="the state folder given to `runner cluster submit`"
    )
    p.add_argument(
        "--timeout", type=float, metavar="S", help="give up after S seconds (default: never)"
    )
    p.add_argument(
        "--poll", type=float, default=1.0, metavar="S", help="seconds between looks (default 1)"
    )
    p.add_argument("--json", action="store_true", help="print the jobs' ends as a JSON array")
    p.set_defaults(func=cmd_wait)


def outcome(end: Ended) -> dict[str, Any]:
    """One job's end as `runner job wait --json` prints it."""
    env = end.envelope
    if env is not None:
        failure = env.get("failure") or {}
        category, reason = failure.get("category"), failure.get("reason")
    elif end.slurm_state == "CANCELLED":
        category, reason = (
            "cancelled",
            "the Slurm job was cancelled before its runner wrote an envelope",
        )
    else:
        category = "infrastructure"
        reason = (
            f"the Slurm job {end.slurm_job} ended {end.slurm_state} without an envelope from "
            f"`runner run`; its log is {end.log}"
        )
    return {
        "jobId": end.job_id,
        "slurmJobId": end.slurm_job,
        "slurmState": end.slurm_state,
        # The envelope's words, for every end: a job cancelled before its runner wrote an
        # envelope failed (category cancelled), as one cancelled while it ran.
        "status": env.get("status") if env else "failed",
        "category": category,
        "reason": reason,
        "log": str(end.log),
        "envelope": env,
    }


def where(state: Path, job_id: str) -> dict[str, Any]:
    """The job's latest submission from ``state``: Slurm's or Kubernetes' (the later one), or
    job_not_found."""
    from runner.scheduling.kubernetes import plan
    from runner.scheduling.slurm.batch import last_submission, submission_of

    kube = plan.last_submission(state, job_id)
    slurm = last_submission(state, job_id)
    if kube is not None and (slurm is None or kube["submittedAt"] >= slurm["submittedAt"]):
        return kube
    return {"to": "slurm", **submission_of(state, job_id)}


def kube_args(sub: dict[str, Any]) -> dict[str, Any]:
    """How to reach a Kubernetes submission's Job again."""
    config = sub.get("kubeconfig")
    return {
        "namespace": sub["namespace"],
        "context": sub.get("context"),
        "kubeconfig": Path(config) if config else None,
    }


def kube_outcome(st: dict[str, Any]) -> dict[str, Any]:
    """A Kubernetes Job's end as `runner job wait --json` prints it: the API server's word."""
    said = f"{st['reason'] or st['state']}: {st['message'] or 'no message'}"
    category, status = {
        "complete": (None, "succeeded"),
        "deadline_exceeded": ("timeout", "failed"),
    }.get(st["state"], ("nonzero_exit", "failed"))
    return {
        "jobId": st["jobId"],
        "to": "kubernetes",
        "kubernetesJob": f"{st['namespace']}/{st['name']}",
        "kubernetesState": st["state"],
        "status": status,
        "category": category,
        "reason": None if category is None else f"the Job ended {said} (as the API server says)",
        "envelope": None,
        # The attempt's end in the job's ledger (the budget it used), or why it is not there.
        "recorded": st.get("recorded"),
    }


def cmd_wait(args: argparse.Namespace) -> int:
    from runner.core.errors import InfrastructureError
    from runner.scheduling.slurm.cluster import Cluster

    if args.poll <= 0 or (args.timeout is not None and args.timeout < 0):
        usage("--poll wants seconds above 0, --timeout seconds of at least 0")
    state = host.state_dir(args.state_dir).resolve()
    cluster = Cluster()
    pending = list(dict.fromkeys(args.job))
    subs = {j: where(state, j) for j in pending}
    ends: dict[str, dict[str, Any]] = {}
    deadline = None if args.timeout is None else clock.monotonic() + args.timeout
    finished_at: dict[str, float] = {}
    failed = 0
    while True:
        try:
            _poll(args, state, cluster, subs, pending, ends, finished_at)
            failed = 0
        except InfrastructureError as exc:  # Slurm or the API server did not answer: again,
            failed += 1  # for a while
            if failed > FAILED_POLLS:
                raise
            print(f"runner: {exc.message} (asking again)", file=sys.stderr)
        if not pending or (deadline is not None and clock.monotonic() >= deadline):
            break
        clock.sleep(args.poll)
    results = [ends[j] for j in dict.fromkeys(args.job) if j in ends]
    if args.json:
        print(json.dumps(results, indent=2))
    if pending:
        print(
            f"runner: infrastructure: {len(pending)} job(s) still queued or running after "
            f"{args.timeout:g} s: {', '.join(pending)}",
            file=sys.stderr,
        )
        return EXIT_INFRASTRUCTURE
    return batch_exit(
        [{"failure": {"category": r["category"]} if r["category"] else None} for r in results]
    )


def _poll(
    args: argparse.Namespace,
    state: Path,
    cluster: Cluster,
    subs: dict[str, dict[str, Any]],
    pending: list[str],
    ends: dict[str, dict[str, Any]],
    finished_at: dict[str, float],
) -> None:
    """One look at every job still waited for; those that ended move from pending to ends."""
    from runner.scheduling.kubernetes import apply
    from runner.scheduling.slurm.cluster import check_end

    slurm_ids = [str(subs[j]["slurmJobId"]) for j in pending if subs[j]["to"] == "slurm"]
    active = cluster.active(slurm_ids) if slurm_ids else {}  # one squeue for all of them
    for job_id in list(pending):
        if subs[job_id]["to"] == "kubernetes":
            st = apply.status(job_id, **kube_args(subs[job_id]), state_dir=state)
            if not st["ended"]:
                continue
            pending.remove(job_id)
            ends[job_id] = kube_outcome(st)
            if not args.json:
                _line(ends[job_id], len(ends), len(args.job))
            continue
        end = check_end(state, job_id, cluster, active)
        if end is None:
            continue
        # Finished in the ledger: give the Slurm job a moment to end too (its runner is
        # exiting), so that the state shown is its last; never wait on it for long.
        first = finished_at.setdefault(job_id, clock.monotonic())
        if end.slurm_active and clock.monotonic() - first < SLURM_END_GRACE_SECONDS:
            continue
        pending.remove(job_id)
        ends[job_id] = outcome(end)
        if not args.json:
            _line(ends[job_id], len(ends), len(args.job))


def _line(r: dict[str, Any], done: int, total: int) -> None:
    values = ", ".join(
        f"{m['measurementId']} = {m['value']}"
        for m in (r["envelope"] or {}).get("measurements") or []
    )
    why = (
        f" ({r['category']}: {str(r['reason'] or '').splitlines()[0][:160]})"
        if r["category"]
        else ""
    )
    where = (
        f"Kubernetes Job {r['kubernetesJob']} {r['kubernetesState']}"
        if r.get("to") == "kubernetes"
        else f"Slurm job {r['slurmJobId']} {r['slurmState']}"
    )
    print(
        f"[{done}/{total}] {r['jobId']}: {r['status']}{why}{': ' + values if values else ''}"
        f"  {where}",
        flush=True,
    )
