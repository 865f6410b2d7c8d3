"""``runner verify contract`` (a contract, against this host) and ``runner verify result`` (a
signed result statement, and its files)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.cli._common import (
    EXIT_SUCCEEDED,
    HOST_HELP,
    RESULT_KEYS_FLAG,
    fmt_clock,
    host_options,
    load_host,
    named_result_keys,
    result_key_options,
    usage,
)

if TYPE_CHECKING:
    from runner.cli._common import Subparsers
    from runner.planning.plan import ExecutionPlan

__all__ = ["register"]


def register(sub: Subparsers, name: str, help: str) -> None:
    if name == "contract":
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
    elif name == "result":
        vres = sub.add_parser(
            name,
            help=help,
            description="Verify a signed result: the DSSE signatures of its in-toto statements "
            "(result.intoto.json, SLSA provenance; result.envelope.intoto.json, the envelope), "
            "that result.json is the one signed, and the SHA-256 of every output file they "
            "sign.",
            epilog=VERIFY_RESULT_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        vres.add_argument(
            "result",
            metavar="RESULT",
            help="a job folder, its result.json, or its result.intoto.json",
        )
        vres.add_argument(
            "--output-dir",
            metavar="DIR",
            help="the output folder to check (default: output/ beside the result)",
        )
        result_key_options(vres)
        vres.add_argument("--trusted-keys", metavar="DIR", help=argparse.SUPPRESS)
        vres.add_argument("--json", action="store_true")
        vres.set_defaults(func=cmd_verify_result)


VERIFY_RESULT_EPILOG = """\
keys: with neither --key nor --result-keys, the keys this host trusts for its own results:
its runner key (<config>/runner-key/runner.pub, or the policy's resultSigningKey) and
<config>/trusted-runner-keys; the output says which key verified. An auditor elsewhere names
the producing host's runner.pub: --key runner.pub (or `runner key trust runner.pub
--result-keys` once). --trusted-keys names issuer (contract signer) keys on every command,
never result signers: here it is refused (exit 2).

values: with the output folder, every value is re-parsed from its evidence with the parser
and config of the contract the envelope names (input/task.json of the job folder), as
verify-bundle does; a value the evidence does not give fails.

exit codes:
  0    every signature and every signed file checked out
  2    the command line was wrong (--trusted-keys given: use --result-keys)
  3    it does not (signature_invalid), or RESULT is not a result (the message names the
       file it needs)
"""


def cmd_verify(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from runner.contract import load_contract
    from runner.planning import plan, policy

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
        "agent": _agent_info(p),
        "timeoutSeconds": p.limits.timeout_seconds,
        "network": p.limits.network,
        "egress": [str(x) for x in p.egress.allow] if p.egress else None,
        "policy": {"source": loaded.source, "digest": loaded.digest},
        "assets": [
            f"{a.id} ({a.sha256[:19]}…, {a.size:,} bytes"
            + (f", unpacked from {a.unpack}" if a.unpack else "")
            + f") at /job/assets/{a.path}"
            for a in m.fetched_assets
        ],
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
        *((("agent", _agent_line(p)),) if p.agent else ()),
        ("command", " ".join(p.argv)),
        ("budget", fmt_clock(p.limits.timeout_seconds)),
        *(("asset", line) for line in info["assets"]),
        *(("measurement", line) for line in info["measurements"]),
        ("policy", f"{loaded.source} ({loaded.digest[:19]}…)"),
    ]
    for key, value in rows:
        print(f"  {key:<15} {value}")
    return EXIT_SUCCEEDED


def _agent_info(p: ExecutionPlan) -> dict[str, Any] | None:
    """Which image the agent's commands run in, and where its runtime comes from."""
    if p.agent is None:
        return None
    return {
        "runtime": p.agent.runtime,
        "runIn": p.agent.adapter.runIn,
        "commandsRunIn": p.image.reference,
        "runtimeImage": p.agent.adapter.image,
        "prompt": p.agent.prompt,
        "promptSource": p.agent.prompt_source,
    }


def _agent_line(p: ExecutionPlan) -> str:
    agent = p.agent
    if agent is None:
        return "-"
    if agent.in_contract_image:
        where = (
            f"its commands run in the contract's image {p.image.reference}, the runtime "
            f"brought in from {agent.adapter.image}"
        )
    else:
        where = (
            f"its commands run in the adapter's image {agent.adapter.image} (runIn "
            f"adapter-image), not the contract's {agent.contract_image}"
        )
    prompt = {"contract": "the contract's", "host": "the host's", "default": "the runner's"}
    return f"{agent.runtime}: {where}; prompt: {prompt[agent.prompt_source]} {agent.prompt}"


def cmd_verify_result(args: argparse.Namespace) -> int:
    from runner.core.errors import SignatureInvalid
    from runner.results import attest

    if args.trusted_keys is not None:
        usage(
            f"verify-result --trusted-keys {args.trusted_keys}: --trusted-keys names issuer "
            "(contract signer) keys on every command, and a result is signed by a runner key; "
            f"pass the folder of trusted runner keys as {RESULT_KEYS_FLAG} DIR "
            "(or a runner key as --key PUB)"
        )
    keys, by_default = named_result_keys(args)
    output = Path(args.output_dir) if args.output_dir else None
    try:
        verified = attest.verify_result(Path(args.result), keys, output)
    except SignatureInvalid as exc:
        if by_default and ("trusted key" in exc.message):
            raise SignatureInvalid(
                f"{exc.message}; trusted by default: this host's own runner key and "
                "<config>/trusted-runner-keys",
                hint="a result made on another host verifies with that host's runner key: "
                "--key RUNNER.pub (its <config>/runner-key/runner.pub)",
            ) from exc
        raise
    sources = {k.keyid: k.source for k in keys}
    envelope, loc = verified.envelope, verified.location
    info: dict[str, Any] = {
        "valid": True,
        "signedBy": [{"keyId": k, "trustedAs": sources.get(k)} for k in verified.keyids],
        "trust": "this host's runner keys (default)" if by_default else "the keys named",
        "statements": [{"file": str(p), "predicateType": t} for p, t in verified.statements],
        "jobId": envelope.get("jobId"),
        "status": envelope.get("status"),
        "contractDigest": envelope.get("contractDigest"),
        "subjects": verified.signed,
        "subjectsChecked": verified.checked,
        "outputDir": str(loc.output) if loc.output else None,
        "measurements": {m["measurementId"]: m["value"] for m in envelope.get("measurements", [])},
        "notes": list(verified.notes),
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return EXIT_SUCCEEDED
    names = ", ".join(p.name for p, _ in verified.statements)
    print(f"ok: the result in {loc.job} verifies ({names})")
    for k in verified.keyids:
        print(f"  signed by {k} ({sources.get(k)})")
    print(f"  job {info['jobId']} ({info['status']}), contract {info['contractDigest']}")
    for mid, value in info["measurements"].items():
        print(f"  {mid} = {value}")
    if loc.output:
        print(f"  {verified.checked} of {verified.signed} signed output files match {loc.output}")
    else:
        print("  output files not checked: no output/ beside it (pass --output-dir)")
    for note in verified.notes:
        print(f"  note: {note}")
    return EXIT_SUCCEEDED
