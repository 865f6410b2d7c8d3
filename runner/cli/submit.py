"""``runner cluster submit CONTRACT… --to slurm|kubernetes``: verify every contract as `runner run`
does, then queue one Slurm job per contract whose batch script runs `runner run` on a node
(runner/scheduling/slurm/batch.py plans it, runner/scheduling/slurm/cluster.py talks to
Slurm), or create each contract's Kubernetes Job and NetworkPolicy with the official client
(runner/scheduling/kubernetes/apply.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.app import host
from runner.cli._common import (
    EXIT_SUCCEEDED,
    HEARTBEAT_SECONDS,
    HOST_HELP,
    checked_lease,
    host_options,
    load_host,
    usage,
)

if TYPE_CHECKING:
    from runner.cli._common import Subparsers
    from runner.scheduling.slurm.batch import Request
    from runner.scheduling.slurm.cluster import Cluster

__all__ = ["register"]

EPILOG = (
    """\
what each job gets (one sbatch per contract):
  --cpus-per-task   the plan's CPU cap, rounded up
  --mem             the plan's memory cap + 512 MiB for the runner itself
  --gres=gpu:N      the plan's GPUs; typed with the first of the contract's preferredGpuTypes
                    that the partition offers (sinfo), else untyped
  --time            the budget left (the job's ledger, else the contract's) + --stop-grace +
                    60 s for set-up and parsing, rounded up to minutes; never more than --time
  --requeue --open-mode=append, a job name and comment with the job id and contract digest,
  its log in <state>/slurm/<job id>/slurm-<Slurm job id>.out

The batch script checks that the node sees the state folder and the contract verified here,
then execs `runner run CONTRACT --state-dir DIR --job-id ID --json` (this Python), whose
envelope goes to <state>/slurm/<job id>/envelope-<Slurm job id>.json. Slurm's SIGTERM (scancel,
time limit) stops the container; a requeued job continues the same budget.

requirements: the state folder, the contract and its inputs on storage every node mounts at
the same paths (a local state folder is refused unless the partition, the default one if none
is named, has one node); Docker and this runner on the nodes; Slurm's KillWait longer than
--stop-grace + 5 s.

  runner cluster submit task.dsse.json --to slurm --state-dir /shared/runner
  runner job wait <job id> --state-dir /shared/runner

Kubernetes (--to kubernetes): each contract is rendered as `runner cluster render --to
kubernetes` renders it and created on the cluster of --kubeconfig/--context (the
NetworkPolicy first). Its job folder must be on the claim, laid out by `runner cluster stage`
under --state-dir (a host that mounts the claim). Each submit is the next attempt in the
job's ledger, its activeDeadlineSeconds the budget left; `runner job wait`, `runner job
status` and `runner job cancel` follow the Job and record the attempt's end (charged from the
pod's times) once they see it. A job whose last attempt's end is not recorded yet is refused
until one of them has. No envelope is written for a cluster's run.

  runner cluster stage task.dsse.json --state-dir /mnt/runner-jobs
  runner cluster submit task.dsse.json --to kubernetes --state-dir /mnt/runner-jobs \\
    --namespace repro

exit codes:
  0    every job was queued
  1    a job has no budget left (resource_exhausted); nothing was queued
  3    refused: as `runner run` refuses, or Slurm refuses the resources (sbatch --test-only),
       or the state folder is not shared; nothing was queued
  4    infrastructure: Slurm does not answer, the policy or keys are broken; or a job id
       already queued and not ended, given twice, or with an attempt in flight (on
       Kubernetes: one whose end `runner job status JOB` has not recorded yet)

"""
    + HOST_HELP
)


def register(sub: Subparsers, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="Verify each contract and this host's policy as `runner run` does; if all\n"
        "pass, queue one cluster job per contract that runs `runner run` on a node. Nothing\n"
        "is queued when any contract is refused.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("contract", metavar="CONTRACT", nargs="+", help="task.json or .dsse.json")
    p.add_argument(
        "--to", required=True, choices=["slurm", "kubernetes"], help="the scheduler to queue in"
    )
    p.add_argument("--partition", metavar="P", help="Slurm partition (default: the default one)")
    p.add_argument("--account", metavar="A", help="Slurm account to charge")
    k = p.add_argument_group("kubernetes")
    k.add_argument(
        "--namespace", metavar="NS", default="default",
        help="the namespace to create the Job in (default: default)",
    )  # fmt: skip
    k.add_argument(
        "--claim", metavar="NAME",
        help="the PersistentVolumeClaim holding the job folders (default: runner-jobs)",
    )  # fmt: skip
    k.add_argument(
        "--runtime-class", metavar="NAME",
        help="gVisor's RuntimeClass, for policies demanding runsc (default: gvisor)",
    )  # fmt: skip
    k.add_argument("--context", metavar="NAME", help="the kubeconfig context (default: current)")
    k.add_argument("--kubeconfig", metavar="FILE", help="default: $KUBECONFIG, ~/.kube/config")
    k.add_argument(
        "--dry-run", action="store_true",
        help="send each create with dryRun=All: checked by the server, nothing stored",
    )  # fmt: skip
    p.add_argument(
        "--time",
        type=int,
        metavar="MINUTES",
        help="the most wall time any job may get; each gets what its budget needs, up to this",
    )
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        help="the state folder, on storage the nodes share (default: as `runner run`)",
    )
    p.add_argument("--job-id", metavar="ID", help="as `runner run --job-id` (one CONTRACT only)")
    p.add_argument(
        "--stop-grace",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="as `runner run --stop-grace` (default 5); must fit Slurm's KillWait",
    )
    p.add_argument(
        "--lease",
        type=float,
        metavar="SECONDS",
        help="as `runner run --lease` (default: its default): how long before another node "
        "may take a lost node's job over (two leases)",
    )
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra label on the job's container, as `runner run --label` (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="print the queued jobs as a JSON array")
    host_options(p)
    p.set_defaults(func=cmd_submit)


def _run_args(args: argparse.Namespace) -> list[str]:
    """The host options `runner run` on the node gets, as given here (paths made absolute)."""
    out = ["--stop-grace", f"{args.stop_grace:g}"]
    if args.lease is not None:  # the node's runner heartbeats at its default
        out += ["--lease", f"{checked_lease(args.lease, HEARTBEAT_SECONDS):g}"]
    if args.policy:
        out += ["--policy", str(Path(args.policy).resolve())]
    if args.trusted_keys:
        out += ["--trusted-keys", str(Path(args.trusted_keys).resolve())]
    for flag in ("allow_unsigned", "allow_network", "allow_unpinned_image"):
        if getattr(args, flag):
            out.append("--" + flag.replace("_", "-"))
    for item in args.label:
        key, sep, _ = item.partition("=")
        if not sep or not key or key.startswith("org.runner."):
            usage(f"--label wants KEY=VALUE (not an org.runner. key), got {item!r}")
        out += ["--label", item]
    return out


SLURM_ONLY = ("partition", "account", "time", "label")
KUBERNETES_ONLY = ("claim", "runtime_class", "context", "kubeconfig", "dry_run")


def cmd_submit(args: argparse.Namespace) -> int:
    if len(args.contract) > 1 and args.job_id:
        usage("--job-id names one job: give it with a single CONTRACT")
    wrong = KUBERNETES_ONLY if args.to == "slurm" else SLURM_ONLY
    for name in wrong:
        if getattr(args, name) not in (None, False, []):
            usage(f"--{name.replace('_', '-')} is not an option of --to {args.to}")
    if args.to == "kubernetes":
        return _kubernetes(args)
    return _slurm(args)


def _kubernetes(args: argparse.Namespace) -> int:
    """Render every contract (refusing before anything is created), then create each."""
    from runner.scheduling.kubernetes import apply, plan, render

    loaded, trust = load_host(args)
    state = host.state_dir(args.state_dir).resolve()
    kw: dict[str, Any] = {
        "namespace": args.namespace,
        "state_dir": state,
        "job_id": args.job_id,
        "claim": args.claim or render.DEFAULT_CLAIM,
        "runtime_class": args.runtime_class or render.DEFAULT_RUNTIME_CLASS,
        "context": args.context,
        "kubeconfig": Path(args.kubeconfig).resolve() if args.kubeconfig else None,
        "dry_run": args.dry_run,
    }
    contracts = [Path(c).resolve() for c in args.contract]
    for c in contracts:  # every refusal first: nothing is created unless all pass
        apply.submit(c, loaded, trust, **kw, apply=False)
    done = []
    for c in contracts:
        got = apply.submit(c, loaded, trust, **kw)
        got["kubeconfig"] = str(kw["kubeconfig"]) if kw["kubeconfig"] else None
        if not args.dry_run:
            plan.record_submission(state, got)
        done.append(got)
        if not args.json:
            what = ", ".join(f"{a['kind']} {a['action']}" for a in got["applied"])
            print(f"{got['jobId']}: {got['namespace']}/{got['name']}: {what}", flush=True)
    if args.json:
        print(json.dumps(done, indent=2))
    return EXIT_SUCCEEDED


def _slurm(args: argparse.Namespace) -> int:
    from runner.scheduling.slurm import batch
    from runner.scheduling.slurm.cluster import Cluster

    if args.time is not None and args.time < 1:
        usage(f"--time wants whole minutes of at least 1, got {args.time}")
    partition = batch.check_name("--partition", args.partition) if args.partition else None
    account = batch.check_name("--account", args.account) if args.account else None
    loaded, trust = load_host(args)
    state = host.state_dir(args.state_dir).resolve()
    cluster = Cluster()
    batch.check_grace(args.stop_grace, cluster.kill_wait())
    kind = batch.fs_type(state, _mountinfo())
    note = batch.check_state_dir(state, cluster.partition_nodes(partition), kind)
    offered = cluster.gpu_types(partition)
    requests = [
        batch.prepare(
            Path(c).resolve(),
            loaded.policy,
            trust,
            state,
            job_id=args.job_id,
            stop_grace=args.stop_grace,
            ceiling=args.time,
            offered=offered,
        )
        for c in args.contract
    ]
    _refuse_repeats(requests, state, cluster)
    run_args = _run_args(args)
    scripts = [batch.write_batch(r, state, sys.executable, run_args) for r in requests]
    # Every refusal before anything is queued: Slurm's answer to --test-only depends on the
    # resources, the partition and the account, not on the name, comment or log path, so one
    # question per distinct set of resources (a submission of many alike contracts asks once).
    asked: set[tuple[int, int, str | None, int]] = set()
    for r, script in zip(requests, scripts, strict=True):
        resources = (r.cpus, r.memMiB, r.gres, r.timeMinutes)
        if resources in asked:
            continue
        asked.add(resources)
        folder = batch.record_dir(state, r.jobId)
        options = batch.sbatch_args(r, folder=folder, partition=partition, account=account)
        cluster.sbatch(options, script, test_only=True)
    queued: list[dict[str, Any]] = []
    for r, script in zip(requests, scripts, strict=True):
        folder = batch.record_dir(state, r.jobId)
        options = batch.sbatch_args(r, folder=folder, partition=partition, account=account)
        slurm_job = cluster.sbatch(options, script)
        extra = {"partition": partition, "account": account, "script": str(script)}
        entry = batch.record(state, r, slurm_job, extra)
        queued.append({**entry, "log": str(folder / f"slurm-{slurm_job}.out")})
        if not args.json:
            print(
                f"queued {r.jobId}: Slurm job {slurm_job}, {r.cpus} CPU, {r.memMiB} MiB"
                f"{', ' + r.gres if r.gres else ''}, {r.timeMinutes} min",
                flush=True,
            )
    if note:
        print(f"runner: note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(queued, indent=2))
    return EXIT_SUCCEEDED


def _refuse_repeats(requests: list[Request], state: Path, cluster: Cluster) -> None:
    """Refuse a job id given twice, and one whose earlier Slurm job has not ended."""
    from runner.core.errors import JobBusy
    from runner.scheduling.slurm import batch

    seen: set[str] = set()
    for r in requests:
        if r.jobId in seen:
            raise JobBusy(
                f"job id {r.jobId} is given twice: Slurm would run two runners for one budget",
                hint="give each contract its own job id",
            )
        seen.add(r.jobId)
        earlier = batch.last_submission(state, r.jobId)
        if earlier is None:
            continue
        info = cluster.job(str(earlier["slurmJobId"]))
        if info is not None and not info.ended:
            raise JobBusy(
                f"job {r.jobId} is already queued as Slurm job {earlier['slurmJobId']} "
                f"({info.state})",
                hint=f"`runner job wait {r.jobId}` or `runner job cancel {r.jobId}` first",
            )


def _mountinfo() -> str:
    try:
        return Path("/proc/self/mountinfo").read_text()
    except OSError:
        return ""
