"""A job after (or while) it runs: ``runner job status``, ``runner verify ledger``, ``runner job
cleanup`` and ``runner job regrade`` (re-grading from stored evidence)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.app import host
from runner.cli._common import (
    EXIT_INFRASTRUCTURE,
    EXIT_JOB_FAILED,
    EXIT_SUCCEEDED,
    envelope_exit,
    fmt_clock,
    summary,
    usage,
)
from runner.core.errors import JobNotFound, RefusedError
from runner.state.jobdir import JobDir, StateDir

if TYPE_CHECKING:
    from runner.cli._common import Subparsers

__all__ = ["_job_root", "register"]


def register(sub: Subparsers, name: str, help: str) -> None:
    if name == "regrade":
        parse = sub.add_parser(
            name,
            help=help,
            description="Re-read the job's evidence with the parser versions its envelope records "
            "(or, with --latest, the newest registered versions, listing what changed) and write a "
            "new envelope revision. Refused if the evidence no longer hashes to what was recorded.",
        )
        parse.add_argument("job", metavar="JOB", help="job id (under --state-dir) or job folder")
        parse.add_argument("--state-dir", metavar="DIR")
        parse.add_argument(
            "--latest",
            action="store_true",
            help="use the newest registered parser versions, marking the changes",
        )
        parse.add_argument(
            "--policy",
            metavar="FILE",
            help="host policy (evidence size cap, key, an agent's secrets to redact)",
        )
        parse.add_argument("--json", action="store_true")
        parse.set_defaults(func=cmd_parse)
    elif name == "status":
        status = sub.add_parser(
            name,
            help=help,
            description="Read a job's ledger: attempts, consumed and remaining budget, the current "
            "state, and (for an attempt in flight) its container as the engine sees it, or its "
            "Kubernetes Job as the API server does (an ended Job's attempt is then recorded in "
            "the ledger, once).",
        )
        status.add_argument("job", metavar="JOB", help="job id (under --state-dir) or job folder")
        status.add_argument("--state-dir", metavar="DIR")
        status.add_argument("--json", action="store_true")
        status.set_defaults(func=cmd_status)
    elif name == "ledger":
        lverify = sub.add_parser(
            name,
            help=help,
            description="Exit 0 when the ledger is intact, 1 naming each broken line otherwise "
            "(a torn last line included). Changes nothing.",
        )
        lverify.add_argument("job", metavar="JOB", help="job id (under --state-dir) or job folder")
        lverify.add_argument("--state-dir", metavar="DIR")
        lverify.add_argument("--json", action="store_true")
        lverify.set_defaults(func=cmd_ledger_verify)
    elif name == "cleanup":
        cleanup = sub.add_parser(
            name,
            help=help,
            description="Of one state folder (--state-dir): remove containers labelled by "
            "this runner whose job has no live runner and whose ledger says the attempt "
            "finished; list (never touch) those whose ledger says they still run: `runner run` "
            "reattaches to them. Also remove every free egress slot of the state folder "
            "(network, proxy and namespace holder that no runner holds and no job container is "
            "in); the next job with egress makes a new one. Another state folder's containers "
            "and slots are neither touched nor listed.",
        )
        cleanup.add_argument(
            "--state-dir",
            metavar="DIR",
            help="the state folder to clean up (default: $RUNNER_STATE_DIR, else the user's; "
            "with --label and no --state-dir, the labelled containers of any)",
        )
        cleanup.add_argument(
            "--dry-run",
            action="store_true",
            help="change nothing: list what it would remove (`would remove`) and keep",
        )
        cleanup.add_argument(
            "--orphans",
            action="store_true",
            help="also stop containers whose ledger says they still run but whose runner is "
            "gone, recording each attempt's end (interrupted, charged to its end) under the "
            "job's lock: what a Slurm epilog runs, since the job's next runner may be on "
            "another host. Without it they are left for `runner run` to reattach to. Exits 4 "
            "when a container it was to stop still runs; one whose job a live runner of this "
            "host owns (a served runner whose client died) is never touched and is no failure",
        )
        cleanup.add_argument(
            "--label",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="only containers with this label (repeatable; e.g. the one `runner cluster "
            "submit` puts on a Slurm job's container); networks and egress slots are then left "
            "alone",
        )
        cleanup.add_argument(
            "--stop-grace",
            type=float,
            default=5.0,
            metavar="SECONDS",
            help="with --orphans: SIGTERM, then SIGKILL after this long (default 5)",
        )
        cleanup.add_argument("--json", action="store_true")
        cleanup.set_defaults(func=cmd_cleanup)


def _job_root(args: argparse.Namespace) -> Path:
    """JOB as a folder path, else a job id under the state dir."""
    given = Path(args.job)
    if JobDir(given).record.is_dir():
        return given
    root: Path = StateDir(host.state_dir(args.state_dir)).job(str(args.job)).root
    if not root.is_dir():
        raise JobNotFound(
            f"no job {args.job!r} under {root.parent}",
            hint="pass the job id and the same --state-dir as `runner run`, or the job folder",
        )
    return root


def cmd_ledger_verify(args: argparse.Namespace) -> int:
    from runner.state import ledger

    path = JobDir(_job_root(args)).ledger
    if not path.exists():
        raise RefusedError(f"{path} does not exist: the job never got past its refusal")
    problems = ledger.verify_file(path)
    lines = len(path.read_bytes().splitlines())
    if args.json:
        print(
            json.dumps(
                {
                    "ledger": str(path),
                    "events": lines,
                    "ok": not problems,
                    "problems": [{"line": p.line, "message": p.message} for p in problems],
                },
                indent=2,
            )
        )
    elif problems:
        for problem in problems:
            print(f"{path}: {problem}")
    else:
        print(f"ok: {path}: {lines} events, chain and order intact")
    return EXIT_JOB_FAILED if problems else EXIT_SUCCEEDED


def _submitted(state: Path, job_id: str) -> dict[str, Any]:
    """Where `runner cluster submit` sent the job: its Slurm job and state now, its Kubernetes
    submission (no cluster asked), each None when it was not sent there."""
    from runner.scheduling.kubernetes.plan import last_submission
    from runner.scheduling.slurm.cluster import describe

    return {"slurm": describe(state, job_id), "kubernetes": last_submission(state, job_id)}


def _status_queued(args: argparse.Namespace, state: Path, job_id: str, found: Exception) -> int:
    """`runner job status` of a job a cluster holds that has not started on a node (no job
    folder or no ledger yet): its submission under ``state`` and the scheduler's state; else
    ``found``."""
    sides = _submitted(state, job_id) if "/" not in job_id else {}
    slurm, kube = sides.get("slurm"), sides.get("kubernetes")
    if slurm is None and kube is None:
        raise found
    where = f"Slurm job {slurm['slurmJobId']}: {slurm['state']}" if slurm else "Kubernetes"
    info: dict[str, Any] = {
        "job": job_id,
        "state": f"submitted, not started on a node yet ({where})",
        "limitSeconds": None,
        "consumedSeconds": 0.0,
        "remainingSeconds": None,
        "attempts": [],
        "container": None,
        "envelope": None,
        **sides,
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return EXIT_SUCCEEDED
    print(f"job        {job_id}  ({info['state']})")
    print("budget     none used yet: the ledger starts when the job starts on its node")
    if slurm:
        print(f"slurm      job {slurm['slurmJobId']}  {slurm['state']}  log {slurm['log']}")
    if kube:
        print(f"kubernetes {json.dumps(kube)}")
    return EXIT_SUCCEEDED


def _kubernetes_end(root: Path, st: Any) -> str | None:
    """For a job whose last attempt is a Kubernetes Job with no recorded end: ask the API
    server (as `runner job wait` does) and record the end if the Job has ended; the Job's state
    as shown, or what kept it from being asked. None for any other job."""
    from runner.core.errors import RunnerError
    from runner.scheduling.kubernetes import apply, attempts

    last = st.in_flight
    if last is None or not attempts.is_kubernetes(last):
        return None
    got, config = last.starting, last.starting.get("kubeconfig")
    try:
        now = apply.status(
            root.name,
            namespace=str(got.get("namespace")),
            context=got.get("context"),
            kubeconfig=Path(config) if isinstance(config, str) else None,
            state_dir=root.parent.parent,
        )
    except RunnerError as exc:
        return f"Kubernetes Job {attempts.job_of(last)}: not asked ({exc.message})"
    return f"Kubernetes Job {now['namespace']}/{now['name']}: {now['state']}"


def cmd_status(args: argparse.Namespace) -> int:
    from runner.state.ledger import read_state

    try:
        root = _job_root(args)
    except JobNotFound as exc:
        return _status_queued(args, host.state_dir(args.state_dir), str(args.job), exc)
    path = JobDir(root).ledger
    if not path.exists():
        refused = RefusedError(f"{path} does not exist: the job never got past its refusal")
        # The folder's own state dir, as for a started job below: a job folder named by its
        # path is never taken for a job of the same id submitted from another state dir.
        return _status_queued(args, root.parent.parent, root.name, refused)
    st = read_state(path)  # an onlooker: never repairs or locks a ledger a runner may be writing
    kube = _kubernetes_end(root, st)
    if kube is not None:
        st = read_state(path)  # with the end it may have recorded
    in_flight = st.in_flight
    if st.finished is not None:
        state = f"finished ({st.finished.get('status')})"
    elif in_flight is not None:
        state = f"attempt {in_flight.number} in flight (or its runner died)"
    else:
        state = "not running"
    container_state = None
    if in_flight is not None:
        from runner import backends
        from runner.core import hostid
        from runner.core.errors import ContainerVanished

        if kube is not None:
            container_state = kube
        elif (other := hostid.elsewhere(in_flight.starting)) is not None:
            container_state = f"on host {other} (not this host's engine to ask)"
        else:
            try:
                container_state = backends.default().state(in_flight.container_name).status
            except ContainerVanished:
                container_state = "gone"
    info: dict[str, Any] = {
        "job": root.name,
        "state": state,
        **st.budget().as_json(),
        "attempts": [
            {
                "attempt": a.number,
                "container": a.container_name,
                "seconds": round(a.seconds, 3),
                "end": (a.finished or {}).get("classification", "in flight"),
                "how": (a.finished or {}).get("how"),
                "host": (a.starting.get("host") or {}).get("name"),
            }
            for a in st.attempts
        ],
        "container": {"name": in_flight.container_name, "state": container_state}
        if in_flight
        else None,
        "envelope": str(JobDir(root).envelope) if JobDir(root).envelope.exists() else None,
    }
    if kube is not None:  # the API server's word on the Job of the last attempt
        info["kubernetesJob"] = kube
    info.update(_submitted(root.parent.parent, root.name))
    if args.json:
        print(json.dumps(info, indent=2))
        return EXIT_SUCCEEDED
    print(f"job        {root.name}  ({state})")
    print(
        f"budget     {fmt_clock(st.consumed)} used of {fmt_clock(st.limit)}, "
        f"{fmt_clock(st.budget().remaining)} left"
    )
    for a in info["attempts"]:
        how = f" ({a['how']})" if a["how"] else ""
        on = f"  on {a['host']}" if a["host"] else ""
        end = f"{a['end']}{how}"
        print(f"attempt {a['attempt']}  {a['seconds']:8.1f} s  {end}  {a['container']}{on}")
    if info["container"]:
        print(f"container  {in_flight.container_name if in_flight else ''}: {container_state}")
    if kube is not None and not info["container"]:
        print(f"container  {kube}")
    if info["envelope"]:
        print(f"envelope   {info['envelope']}")
    if info["slurm"]:
        print("slurm      job {slurmJobId} {state} (log {log})".format(**info["slurm"]))
    if info["kubernetes"]:
        k = info["kubernetes"]
        print(f"kubernetes Job {k['namespace']}/{k['name']} submitted {k['submittedAt']} "
              "(asked while its attempt is in flight)")  # fmt: skip
    return EXIT_SUCCEEDED


def cmd_cleanup(args: argparse.Namespace) -> int:
    from runner.execution import sweeper

    labels: dict[str, str] = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            usage(f"--label wants KEY=VALUE, got {item!r}")
        labels[key] = value
    state = host.state_dir(args.state_dir) if args.state_dir or not labels else None
    report = sweeper.sweep(
        state_dir=state,
        dry_run=args.dry_run,
        orphans=args.orphans,
        labels=labels,
        grace=args.stop_grace,
    )
    gone = report["wouldRemove"] if args.dry_run else report["removed"]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        verb = "would remove" if args.dry_run else "removed"
        for item in gone:
            print(f"{verb}  {item['name']}  ({item['why']})")
        for item in report["kept"]:
            print(f"{'would keep' if args.dry_run else 'kept'}  {item['name']}  ({item['why']})")
        if not gone and not report["kept"]:
            where = f"of state folder {report['stateDir']}" if state else "with those labels"
            print(f"nothing of this runner {where} on this engine")
        elif args.dry_run:
            print("dry run: nothing was removed or stopped")
    running = [
        k for k in report["kept"]
        if k["status"] == "running" and not k["why"].startswith(sweeper.WATCHED)
    ]  # fmt: skip
    if args.orphans and not args.dry_run and running:  # what an Epilog must not let pass
        names = ", ".join(k["name"] for k in running)
        print(f"runner: infrastructure: still running after --orphans: {names}", file=sys.stderr)
        return EXIT_INFRASTRUCTURE
    return EXIT_SUCCEEDED


def cmd_parse(args: argparse.Namespace) -> int:
    from runner.app.regrade import regrade
    from runner.execution import orchestrator
    from runner.planning import policy

    loaded = policy.load(host.policy_path(args.policy))
    envelope = regrade(
        _job_root(args),
        latest=args.latest,
        max_bytes=int(loaded.policy.maxEvidenceMb * 1024 * 1024),
        result_key=host.result_key_path(loaded.policy.resultSigningKey),
        max_result_bytes=int(loaded.policy.maxResultKb * 1024),
        agent_adapters=loaded.policy.agents,
    )
    data = orchestrator.as_json(envelope)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(f"revision {envelope.revision} of {envelope.jobId}, re-read from stored evidence")
        for change in envelope.regrade.changes if envelope.regrade else []:
            print(f"  changed: {change}")
        print(summary(data, Path(envelope.jobDir) / "result.json" if envelope.jobDir else None))
    return envelope_exit(envelope)
