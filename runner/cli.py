"""The command line: the only place that prints or chooses exit codes."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from runner.errors import RefusedError, RunnerError

EXIT_SUCCEEDED = 0
EXIT_JOB_FAILED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_INFRASTRUCTURE = 4
EXIT_CANCELLED = 130

EXIT_CODES_HELP = """\
exit codes:
  0    the job succeeded (every measurement was read)
  1    the job ran and failed: non-zero exit, OOM, timeout, missing or unparseable evidence
       (also a 'partial' result, where some measurements were read)
  2    the command line was wrong
  3    refused before anything ran: invalid contract, policy violation, ambiguous protocol,
       image digest mismatch, job id already finished
  4    infrastructure: the engine is unreachable, the image is not here, the runner failed
  130  interrupted (Ctrl-C or SIGTERM); the container was stopped and an envelope written
"""

FAMILY_EXIT = {
    "succeeded": EXIT_SUCCEEDED,
    "job_failed": EXIT_JOB_FAILED,
    "refused": EXIT_REFUSED,
    "infrastructure": EXIT_INFRASTRUCTURE,
    "cancelled": EXIT_CANCELLED,
}


def _state_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    if os.environ.get("RUNNER_STATE_DIR"):
        return Path(os.environ["RUNNER_STATE_DIR"])
    import platformdirs

    return Path(platformdirs.user_state_dir("runner"))


def _labels(values: list[str]) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"runner: --label wants KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _fmt_clock(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class HumanProgress:
    """Progress for people, on stderr: one line a stage, a live clock while the job runs."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_line = 0.0
        self._live = False

    def stage(self, name: str, detail: str) -> None:
        self._end_live()
        print(f"==> {name:<9} {detail}", file=self.stream, flush=True)
        if name == "image":
            print("==> container starting", file=self.stream, flush=True)

    def running(self, elapsed: float, budget: float) -> None:
        text = f"    running  {_fmt_clock(elapsed)} of {_fmt_clock(budget)} budget"
        if self.tty:
            self.stream.write("\r" + text)
            self.stream.flush()
            self._live = True
        elif time.monotonic() - self._last_line >= 30:
            self._last_line = time.monotonic()
            print(text, file=self.stream, flush=True)

    def _end_live(self) -> None:
        if self._live:
            self.stream.write("\n")
            self._live = False

    def done(self) -> None:
        self._end_live()


def _summary(env: dict[str, Any], path: Path | None) -> str:
    rows: list[tuple[str, str]] = [("status", env["status"])]
    if env.get("failure"):
        f = env["failure"]
        rows.append(("failure", f"{f['category']} at {f['stage']}"))
    rows.append(("job", str(env.get("jobId"))))
    if env.get("exitCode") is not None:
        rows.append(("exit code", str(env["exitCode"])))
    if env.get("image"):
        rows.append(("image", str(env["image"]["id"])))
    t = env["timings"]
    if t.get("runSeconds") is not None:
        rows.append(("ran", f"{t['runSeconds']:.1f} s (total {t['totalSeconds']:.1f} s)"))
    if path:
        rows.append(("envelope", str(path)))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    if env["measurements"]:
        table = [("measurement", "metric", "value", "unit", "parser")]
        for m in env["measurements"]:
            table.append(
                (
                    m["measurementId"],
                    m["metric"],
                    f"{m['value']:g}" if isinstance(m["value"], float) else str(m["value"]),
                    m["unit"],
                    f"{m['parser']['id']}@{m['parser']['version']}",
                )
            )
        widths = [max(len(r[i]) for r in table) for i in range(5)]
        lines.append("")
        lines.extend(
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table
        )
    for err in env.get("measurementErrors", []):
        lines.append(f"! {err['measurementId']}: {err['category']}: {err['reason']}")
    if env.get("failure"):
        lines.append("")
        lines.append(env["failure"]["reason"])
    return "\n".join(lines)


def _install_signal_handlers() -> None:
    """SIGTERM behaves as Ctrl-C: the first stops the job cleanly; later ones are ignored so
    the clean-up is not cut short."""
    fired = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def cmd_run(args: argparse.Namespace) -> int:
    from runner import orchestrator
    from runner.policy import HostPolicy

    base = HostPolicy.from_environment()
    policy = HostPolicy(
        allow_network=base.allow_network or args.allow_network,
        allow_unpinned_images=base.allow_unpinned_images or args.allow_unpinned_image,
    )
    options = orchestrator.RunOptions(
        state_dir=_state_dir(args.state_dir),
        job_id=args.job_id,
        policy=policy,
        labels=_labels(args.label),
        stop_grace_seconds=args.stop_grace,
    )
    progress = None if args.json else HumanProgress()
    _install_signal_handlers()
    envelope = orchestrator.run(Path(args.contract), options, progress=progress)
    if progress:
        progress.done()
    data = orchestrator.as_json(envelope)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        where = Path(envelope.jobDir) / "result.json" if envelope.jobDir else None
        print(_summary(data, where if where and where.exists() else None))
    return FAMILY_EXIT[orchestrator.failure_exit_family(envelope)]


def cmd_verify(args: argparse.Namespace) -> int:
    from runner import plan
    from runner.contract import load_contract
    from runner.policy import HostPolicy

    contract = load_contract(Path(args.contract))
    policy = HostPolicy.from_environment()
    p = plan.build(
        contract,
        policy,
        job_id=args.job_id or plan.default_job_id(contract),
        host_uid=0,
        host_gid=0,
    )
    m = contract.model
    info: dict[str, Any] = {
        "valid": True,
        "name": m.name,
        "contractDigest": contract.digest,
        "jobId": p.job_id,
        "image": m.environment.image,
        "imageId": p.image.image_id,
        "command": list(p.argv),
        "timeoutSeconds": p.limits.timeout_seconds,
        "network": p.limits.network,
        "measurements": [
            f"{x.measurementId} ({x.metric}, {x.unit}) via {x.parser.id}@{x.parser.version} "
            f"from {x.parser.evidencePath}"
            for x in m.measurements
        ],
        "signature": "none (signed contracts are not supported yet)",
    }
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(f"ok: {args.contract} verifies")
        for key in ("name", "contractDigest", "jobId", "image", "network", "signature"):
            print(f"  {key:<15} {info[key]}")
        print(f"  {'command':<15} {' '.join(p.argv)}")
        print(f"  {'budget':<15} {_fmt_clock(p.limits.timeout_seconds)}")
        for line in info["measurements"]:
            print(f"  {'measurement':<15} {line}")
    return EXIT_SUCCEEDED


def cmd_pin(args: argparse.Namespace) -> int:
    from runner.backends.docker import DockerBackend
    from runner.contract import parse_json, verify_data, with_digest

    path = Path(args.contract)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RefusedError(f"cannot read {path}: {exc.strerror}") from exc
    data = parse_json(raw, str(path))
    info = DockerBackend().inspect_image(args.image)
    if info is None:
        from runner.errors import ImageUnavailable

        raise ImageUnavailable(
            f"no local image {args.image!r} to pin",
            hint="build it first (scripts/setup.sh builds runner-cpu:local) or `docker load` it",
        )
    env = data.get("environment")
    if not isinstance(env, dict):
        from runner.errors import ContractError

        raise ContractError("must be an object to pin an image into", path="$.environment")
    name = args.image.split("@", 1)[0]
    digests = [d for d in info.repo_digests if d.split("@", 1)[0] == name.rsplit(":", 1)[0]]
    env["image"] = digests[0] if digests else info.id
    env["imageId"] = info.id
    pinned = with_digest(data)
    text = json.dumps(pinned, indent=2, ensure_ascii=False) + "\n"
    out = Path(args.output) if args.output else path
    verify_data(pinned, text.encode(), path.resolve().parent, str(out))
    if out.resolve().parent != path.resolve().parent:
        print(
            f"note: {out} is not beside {path}; its relative input paths resolve from {out.parent}",
            file=sys.stderr,
        )
    out.write_text(text, encoding="utf-8")
    result = {
        "contract": str(out),
        "image": env["image"],
        "imageId": info.id,
        "contractDigest": pinned["contractDigest"],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"pinned {args.image} as {env['image']}")
        print(f"  contractDigest {pinned['contractDigest']}")
        print(f"  written to     {out}")
    return EXIT_SUCCEEDED


def cmd_parsers(args: argparse.Namespace) -> int:
    from runner.parsers import registry

    items: list[dict[str, Any]] = []
    for pid, version in registry.available():
        parser = registry.get(pid, version)
        items.append(
            {
                "id": pid,
                "version": version,
                "description": parser.description,
                "configSchema": parser.config_schema,
            }
        )
    if args.json:
        print(json.dumps(items, indent=2))
    else:
        for item in items:
            print(f"{item['id']}@{item['version']}  {item['description']}")
            print(f"    config: {json.dumps(item['configSchema']['properties'])}")
    return EXIT_SUCCEEDED


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runner",
        description=(
            "Run a scientific reproduction exactly as its contract says: a pinned image, a "
            "sealed container (no network, read-only inputs, hard caps), and a result envelope "
            "with every measurement traced to its evidence file."
        ),
        epilog=EXIT_CODES_HELP + "\nexamples:\n"
        "  runner verify examples/toy-evaluation/task.json\n"
        "  runner pin task.json --image runner-cpu:local -o pinned.json\n"
        "  runner run pinned.json            # progress on stderr, a summary table on stdout\n"
        "  runner run pinned.json --json     # only the envelope, for machines\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="run a contract's job in a container and write its result envelope",
        description=(
            "Verify the contract, stage its inputs into <state>/jobs/<job id>/, run the pinned "
            "image with no network and hard caps, then read every measurement through its "
            "parser. The envelope is written to <state>/jobs/<job id>/result.json."
        ),
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("contract", metavar="CONTRACT", help="the contract (task.json)")
    run.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where job folders live (default: $RUNNER_STATE_DIR, else the user's state dir, "
        "e.g. ~/.local/state/runner)",
    )
    run.add_argument(
        "--job-id",
        metavar="ID",
        help="job id (default: the contract's jobId, else <name>-<digest prefix>)",
    )
    run.add_argument(
        "--json",
        action="store_true",
        help="print only the result envelope (JSON) on stdout; no progress",
    )
    run.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra label on the job's container (repeatable)",
    )
    run.add_argument(
        "--allow-network",
        action="store_true",
        help="grant network to a contract that asks for it (default: never)",
    )
    run.add_argument(
        "--allow-unpinned-image",
        action="store_true",
        help="accept a tag-only image reference (local development only)",
    )
    run.add_argument(
        "--stop-grace",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="seconds between SIGTERM and SIGKILL when stopping the job (default 5)",
    )
    run.set_defaults(func=cmd_run)

    verify = sub.add_parser(
        "verify",
        help="check a contract (JSON, schema, digest, parsers, command) without running it",
        description="Check a contract without running anything; exit 0 when it would be run.",
    )
    verify.add_argument("contract", metavar="CONTRACT")
    verify.add_argument("--job-id", metavar="ID")
    verify.add_argument("--json", action="store_true", help="print the findings as JSON")
    verify.set_defaults(func=cmd_verify)

    pin = sub.add_parser(
        "pin",
        help="issuer side: pin a local image into a contract and recompute contractDigest",
        description=(
            "Look up a local image, write its manifest digest (when it has one) or image id into "
            "environment.image and its id into environment.imageId, then recompute "
            "contractDigest."
        ),
    )
    pin.add_argument("contract", metavar="CONTRACT")
    pin.add_argument(
        "--image",
        required=True,
        metavar="REF",
        help="a local image: name:tag, name@sha256:… or sha256:<id>",
    )
    pin.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the pinned contract here (default: overwrite CONTRACT)",
    )
    pin.add_argument("--json", action="store_true")
    pin.set_defaults(func=cmd_pin)

    parsers = sub.add_parser("parsers", help="list the registered evidence parsers")
    parsers.add_argument("--json", action="store_true")
    parsers.set_defaults(func=cmd_parsers)
    return parser


def _refusal_exit(exc: RunnerError) -> int:
    if isinstance(exc, RefusedError):
        return EXIT_REFUSED
    if exc.category in {"missing_evidence", "parse_error"}:
        return EXIT_JOB_FAILED
    return EXIT_INFRASTRUCTURE


def main(argv: list[str] | None = None) -> NoReturn:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except RunnerError as exc:
        if getattr(args, "json", False):
            print(
                json.dumps(
                    {
                        "valid": False,
                        "category": exc.category,
                        "error": exc.message,
                        "hint": exc.hint,
                    },
                    indent=2,
                )
            )
        print(f"runner: {exc.category}: {exc}", file=sys.stderr)
        code = _refusal_exit(exc)
    except KeyboardInterrupt:
        print("runner: interrupted", file=sys.stderr)
        code = EXIT_CANCELLED
    sys.exit(code)
