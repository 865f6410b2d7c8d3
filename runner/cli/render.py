"""``runner cluster render CONTRACT --to kubernetes``: the manifests for a cluster to run one job
(runner/scheduling/kubernetes/render.py builds them), after the same checks as `runner run`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.app import host
from runner.cli._common import EXIT_SUCCEEDED, HOST_HELP, host_options, load_host

if TYPE_CHECKING:
    from runner.cli._common import Subparsers

__all__ = ["register"]

EPILOG = (
    """\
what is rendered: a batch/v1 Job (backoffLimit 0; activeDeadlineSeconds from the budget left
in the job's ledger under --state-dir, else the contract's whole budget; the image by digest;
non-root, read-only root, capabilities drop ALL, no privilege escalation, seccomp
RuntimeDefault; CPU and memory requests equal to limits; nvidia.com/gpu for GPUs;
runtimeClassName for gVisor where the policy demands runsc; the job folder from the claim,
/job/input read-only; /tmp and /dev/shm as size-limited memory emptyDirs) and a NetworkPolicy
that denies all ingress and egress. Output: JSON, which kubectl reads as it reads YAML.

  runner cluster render task.dsse.json --to kubernetes | kubectl apply -f -
  runner cluster render task.dsse.json --to kubernetes -o manifests/ && kubectl apply -f manifests/

A Job applied from these manifests is no attempt in the job's ledger: it runs outside the one
budget (activeDeadlineSeconds bounds that Job alone; a Job applied again after it is deleted
gets it again). `runner cluster submit --to kubernetes` creates the Job and records it.

The job folder (<claim>/jobs/<job id>/input ... as `runner run` lays it out) must be on the
claim before the Job starts: `runner cluster stage CONTRACT --state-dir <claim as mounted
here>` lays it out; see docs/how-to/kubernetes.md for what Kubernetes does and does not
enforce compared with `runner run`.

exit codes:
  0    rendered
  1    the job has no budget left (resource_exhausted)
  3    refused: the same refusals as `runner run`, and what a cluster cannot run yet (an image
       pinned by a local image id only, network or egress, agent_planned, gpu "all",
       assets); nothing is written
  4    infrastructure: the policy or keys are broken, the ledger is unreadable

"""
    + HOST_HELP
)


def register(sub: Subparsers, name: str, help: str) -> None:
    render = sub.add_parser(
        name,
        help=help,
        description="Verify the contract and this host's policy as `runner run` does, then "
        "write the manifests a cluster needs to run the job exactly as planned (no cluster "
        "is contacted).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    render.add_argument("contract", metavar="CONTRACT", help="task.json, or a signed .dsse.json")
    render.add_argument(
        "--to", required=True, choices=["kubernetes"], help="the scheduler to render for"
    )
    render.add_argument(
        "-o",
        "--output",
        default="-",
        metavar="DIR|-",
        help="a folder to write job.json and networkpolicy.json into (made if missing), or - "
        "for one v1 List on stdout (default)",
    )
    render.add_argument(
        "--namespace", metavar="NS", help="the manifests' namespace (default: none)"
    )
    render.add_argument(
        "--claim",
        metavar="NAME",
        help="the PersistentVolumeClaim holding the job folders (default: runner-jobs)",
    )
    render.add_argument(
        "--runtime-class",
        metavar="NAME",
        help="the RuntimeClass of gVisor on the cluster, for policies demanding runsc "
        "(default: gvisor)",
    )
    render.add_argument("--job-id", metavar="ID", help="as `runner run --job-id`")
    render.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where the job's ledger is read for the budget left (as `runner run`)",
    )
    render.add_argument(
        "--json", action="store_true", help="print what was rendered (and where) as JSON"
    )
    host_options(render)
    render.set_defaults(func=cmd_render)


def cmd_render(args: argparse.Namespace) -> int:
    from runner.scheduling.kubernetes import plan, render

    loaded, trust = load_host(args)
    r = plan.rendered(
        Path(args.contract),
        loaded,
        trust,
        state_dir=host.state_dir(args.state_dir),
        job_id=args.job_id,
        namespace=args.namespace or None,
        claim=args.claim or render.DEFAULT_CLAIM,
        runtime_class=args.runtime_class or render.DEFAULT_RUNTIME_CLASS,
    )
    p, manifests, deadline, state = r.plan, r.manifests, r.deadline, r.state
    namespace, claim, runtime_class = r.namespace, r.claim, r.runtime_class
    files = _write(manifests, args.output)
    info: dict[str, Any] = {
        "rendered": True,
        "to": "kubernetes",
        "jobId": p.job_id,
        "contractDigest": r.contract_digest,
        "name": manifests[0]["metadata"]["name"],
        "namespace": namespace,
        "claim": claim,
        "activeDeadlineSeconds": deadline,
        "budgetFrom": "ledger" if state is not None and state.accepted else "contract",
        "runtimeClassName": runtime_class if p.limits.runtime == "runsc" else None,
        "gpus": p.limits.gpus if isinstance(p.limits.gpus, int) else 0,
        "gpuFallback": p.gpu_fallback,
        "files": [str(f) for f in files],
        "notEnforced": list(render.NOT_ENFORCED),
        "ledger": NOT_AN_ATTEMPT,
    }
    if args.json:
        if not files:
            info["manifests"] = render.as_list(manifests)
        print(json.dumps(info, indent=2))
    elif not files:
        print(json.dumps(render.as_list(manifests), indent=2))
    else:
        print(f"ok: Job and NetworkPolicy {info['name']} for job {p.job_id}")
        for f in files:
            print(f"  wrote {f}")
        print(f"  activeDeadlineSeconds {deadline} (from the {info['budgetFrom']})")
    print(f"runner: note: {NOT_AN_ATTEMPT}", file=sys.stderr)
    if p.gpu_fallback:
        print(f"runner: note: no GPUs requested: {p.gpu_fallback}", file=sys.stderr)
    return EXIT_SUCCEEDED


NOT_AN_ATTEMPT = (
    "a Job applied from these manifests is no attempt in the job's ledger: it runs outside the "
    "job's one budget (its activeDeadlineSeconds bounds that Job alone); `runner cluster submit "
    "--to kubernetes` creates the Job and records it"
)


def _write(manifests: list[dict[str, Any]], output: str) -> list[Path]:
    """Write each manifest as ``<kind, lower case>.json`` in the folder ``output`` (none for
    ``-``); a file there is replaced as a whole, a link in its place never followed."""
    from runner.state.jobdir import atomic_write

    if output == "-":
        return []
    folder = Path(output)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for m in manifests:
        path = folder / f"{m['kind'].lower()}.json"
        atomic_write(path, (json.dumps(m, indent=2) + "\n").encode())
        written.append(path)
    return written
