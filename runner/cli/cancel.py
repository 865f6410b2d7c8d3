"""``runner job cancel JOB…``: cancel jobs queued by `runner cluster submit`: scancel (the
runner in a running job stops its container on Slurm's SIGTERM and records the attempt
cancelled), or delete a Kubernetes Job and its NetworkPolicy."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from runner.app import host
from runner.cli._common import EXIT_SUCCEEDED

if TYPE_CHECKING:
    from runner.cli._common import Subparsers

__all__ = ["register"]

EPILOG = """\
A pending job leaves the queue; a running one gets SIGTERM: its runner stops the container
within --stop-grace, records the attempt cancelled (the budget it used stays spent) and writes
its envelope. `runner job wait JOB` then exits 130. A job that has already ended is left as it is.
A Kubernetes job (`runner cluster submit --to kubernetes`): its Job is deleted with its pods
(propagationPolicy Foreground), and once the Job is gone, its NetworkPolicy; the attempt's
end is recorded in the job's ledger (charged from its pod's start to the Job's deletion).

exit codes:
  0    each job was cancelled, or had already ended
  4    infrastructure: scancel or the API server failed
  5    no such job submitted from this state folder
"""


def register(sub: Subparsers, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="Cancel jobs queued by `runner cluster submit`: scancel, or delete the Job.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "job", metavar="JOB", nargs="+", help="job id, as `runner cluster submit` printed it"
    )
    p.add_argument(
        "--state-dir", metavar="DIR", help="the state folder given to `runner cluster submit`"
    )
    p.add_argument("--json", action="store_true", help="print what was done as a JSON array")
    p.set_defaults(func=cmd_cancel)


def cmd_cancel(args: argparse.Namespace) -> int:
    from runner.cli.wait import kube_args, where
    from runner.scheduling.kubernetes import apply
    from runner.scheduling.slurm.cluster import Cluster

    state = host.state_dir(args.state_dir).resolve()
    cluster = Cluster()
    subs = {job_id: where(state, job_id) for job_id in args.job}
    done: list[dict[str, Any]] = []
    for job_id, sub in subs.items():
        if sub["to"] == "kubernetes":
            gone = apply.delete(job_id, **kube_args(sub), state_dir=state)
            name = f"{gone['namespace']}/{gone['name']}"
            done.append({"jobId": job_id, "kubernetesJob": name, "cancelled": not gone["ended"],
                         "deleted": True, "kubernetesState": gone["state"],
                         "networkPolicy": gone["networkPolicy"],
                         "recorded": gone.get("recorded")})  # fmt: skip
            if not args.json:
                print(f"{job_id}: Kubernetes Job {name} ({gone['state']}) deleted; its "
                      f"NetworkPolicy {gone['networkPolicy']}")  # fmt: skip
            continue
        slurm_job = str(sub["slurmJobId"])
        info = cluster.job(slurm_job)
        ended = info is None or info.ended
        if not ended:
            cluster.cancel(slurm_job)
        state_now = info.state if info else "UNKNOWN"
        done.append(
            {
                "jobId": job_id,
                "slurmJobId": slurm_job,
                "cancelled": not ended,
                "slurmState": state_now,
            }
        )
        if not args.json:
            said = "cancelled" if not ended else f"had already ended ({state_now})"
            print(f"{job_id}: Slurm job {slurm_job} {said}")
    if args.json:
        print(json.dumps(done, indent=2))
    return EXIT_SUCCEEDED
