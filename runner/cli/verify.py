"""``runner verify`` (a contract, against this host) and ``runner verify-result`` (a signed
result statement, and its files)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner import host
from runner.cli._common import EXIT_SUCCEEDED, HOST_HELP, fmt_clock, host_options, load_host

if TYPE_CHECKING:
    from runner.cli._common import Subparsers


def register(sub: Subparsers, name: str, help: str) -> None:
    if name == "verify":
        verify = sub.add_parser(
            name,
            help=help,
            description="Check a contract (signature, digest, schema, parsers, command, host "
            "policy) without running anything; exit 0 when this host would run it, 3 if refused.",
            epilog=HOST_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        verify.add_argument(
            "contract", metavar="CONTRACT", help="task.json, or a signed .dsse.json"
        )
        verify.add_argument("--job-id", metavar="ID")
        verify.add_argument("--json", action="store_true", help="print the findings as JSON")
        host_options(verify)
        verify.set_defaults(func=cmd_verify)
    elif name == "verify-result":
        vres = sub.add_parser(
            name,
            help=help,
            description="Verify the in-toto statement's DSSE signature against trusted runner keys "
            "and, with --output-dir, the SHA-256 of every file it names.",
            epilog="The runner's own public key is <config>/runner-key/runner.pub; an auditor "
            "trusts it with: runner trust runner.pub --trusted-keys <config>/trusted-runner-keys",
        )
        vres.add_argument("statement", metavar="FILE", help="a job's result.intoto.json")
        vres.add_argument("--output-dir", metavar="DIR", help="the job's output folder")
        vres.add_argument(
            "--trusted-keys",
            metavar="DIR",
            help="trusted runner keys (default <config>/trusted-runner-keys)",
        )
        vres.add_argument("--json", action="store_true")
        vres.set_defaults(func=cmd_verify_result)


def cmd_verify(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from runner import plan, policy
    from runner.contract import load_contract

    loaded, trust = load_host(args)
    contract = load_contract(Path(args.contract), trust)
    plan.check_mode(contract, loaded.policy)
    policy.check(contract, loaded.policy, datetime.now(UTC))
    p = plan.build(
        contract,
        loaded.policy,
        job_id=args.job_id or plan.default_job_id(contract),
        host_uid=0,
        host_gid=0,
    )
    m = contract.model
    sig = contract.signature
    info: dict[str, Any] = {
        "valid": True,
        "name": m.name,
        "contractDigest": contract.digest,
        "signature": "verified" if sig else "none (unsigned; accepted by this host's policy)",
        "signedBy": list(sig.keyids) if sig else [],
        "payloadType": sig.payload_type if sig else None,
        "issuedAt": m.issuedAt.isoformat() if m.issuedAt else None,
        "expiresAt": m.expiresAt.isoformat() if m.expiresAt else None,
        "audience": m.audience,
        "jobId": p.job_id,
        "image": m.environment.image,
        "imageId": p.image.image_id,
        "command": list(p.argv),
        "agent": {"runtime": p.agent.runtime, "image": p.agent.adapter.image}
        if p.agent is not None
        else None,
        "timeoutSeconds": p.limits.timeout_seconds,
        "network": p.limits.network,
        "egress": [str(x) for x in p.egress.allow] if p.egress else None,
        "policy": {"source": loaded.source, "digest": loaded.digest},
        "measurements": [
            f"{x.measurementId} ({x.metric}, {x.unit}) via {x.parser.id}@{x.parser.version} "
            f"from {x.parser.evidencePath}"
            for x in m.measurements
        ],
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return EXIT_SUCCEEDED
    print(f"ok: {args.contract} verifies and this host would run it")
    rows = [
        ("name", m.name),
        ("contractDigest", contract.digest),
        ("signature", info["signature"]),
        *(("signed by", k) for k in info["signedBy"]),
        ("issued", info["issuedAt"] or "-"),
        ("expires", info["expiresAt"] or "never (unsigned)"),
        ("audience", ", ".join(m.audience) if m.audience else "any host"),
        ("jobId", p.job_id),
        ("image", m.environment.image),
        ("network", p.limits.network),
        *((("egress", ", ".join(info["egress"])),) if p.egress else ()),
        *((("agent", f"{p.agent.runtime} in {p.agent.adapter.image}"),) if p.agent else ()),
        ("command", " ".join(p.argv)),
        ("budget", fmt_clock(p.limits.timeout_seconds)),
        *(("measurement", line) for line in info["measurements"]),
        ("policy", f"{loaded.source} ({loaded.digest[:19]}…)"),
    ]
    for key, value in rows:
        print(f"  {key:<15} {value}")
    return EXIT_SUCCEEDED


def cmd_verify_result(args: argparse.Namespace) -> int:
    from runner import attest, signing

    keys = signing.load_trusted_keys(host.trusted_runner_keys_dir(args.trusted_keys))
    output = Path(args.output_dir) if args.output_dir else None
    verified = attest.verify_result(Path(args.statement), keys, output)
    predicate = verified.statement["predicate"]
    info = {
        "valid": True,
        "signedBy": list(verified.keyids),
        "jobId": predicate.get("jobId"),
        "status": predicate.get("status"),
        "contractDigest": predicate.get("contractDigest"),
        "subjects": len(verified.statement.get("subject", [])),
        "subjectsChecked": verified.checked,
        "measurements": {m["measurementId"]: m["value"] for m in predicate["measurements"]},
    }
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(f"ok: {args.statement} is signed by {', '.join(verified.keyids)}")
        print(f"  job {info['jobId']} ({info['status']}), contract {info['contractDigest']}")
        for mid, value in info["measurements"].items():
            print(f"  {mid} = {value}")
        checked = f"{verified.checked} of {info['subjects']} files checked against {output}"
        print(f"  {checked if output else 'files not checked (pass --output-dir)'}")
    return EXIT_SUCCEEDED
