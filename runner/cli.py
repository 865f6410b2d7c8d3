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
from typing import TYPE_CHECKING, Any, NoReturn

from runner.errors import RefusedError, RunnerError

if TYPE_CHECKING:
    from runner import orchestrator
    from runner.contract import Trust
    from runner.policy import LoadedPolicy

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
  3    refused before anything ran: invalid contract, bad or missing signature, policy
       violation, ambiguous protocol, image digest mismatch
  4    infrastructure: the engine is unreachable, the image is not here, no GPU to give,
       the host's policy or keys are broken, the runner failed
  (a job that already finished prints its stored envelope and exits with its code)
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


def _usage(message: str) -> NoReturn:
    """A command-line mistake: say so and exit 2, as argparse does."""
    print(f"runner: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def _labels(values: list[str]) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _usage(f"--label wants KEY=VALUE, got {item!r}")
        if key.startswith("org.runner."):
            _usage(f"--label {key}: the org.runner. labels are the runner's own")
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

    def running(self, elapsed: float, budget: float) -> None:
        text = f"    running  {_fmt_clock(elapsed)} of {_fmt_clock(budget)} budget"
        if self.tty:
            self.stream.write("\r" + text)
            self.stream.flush()
            self._live = True
        elif time.monotonic() - self._last_line >= 30:
            self._last_line = time.monotonic()
            print(text, file=self.stream, flush=True)

    def transfer(self, label: str, done: int, total: int) -> None:
        mib = 1024 * 1024
        text = f"    {label}: {done / mib:,.1f} of {total / mib:,.1f} MiB"
        if self.tty:
            self.stream.write("\r" + text)
            self.stream.flush()
            self._live = True
        elif time.monotonic() - self._last_line >= 5:
            self._last_line = time.monotonic()
            print(text, file=self.stream, flush=True)

    def _end_live(self) -> None:
        if self._live:
            self.stream.write("\n")
            self._live = False

    def done(self) -> None:
        self._end_live()


class NotesOnly:
    """Under --json: stdout carries only the envelope; notable events still reach stderr."""

    def stage(self, name: str, detail: str) -> None:
        if name in {"job", "recover", "policy", "registry"}:
            print(f"runner: {detail}", file=sys.stderr, flush=True)

    def running(self, elapsed: float, budget: float) -> None:
        pass

    def transfer(self, label: str, done: int, total: int) -> None:
        pass


def _summary(env: dict[str, Any], path: Path | None) -> str:
    rows: list[tuple[str, str]] = [("status", env["status"])]
    if env.get("failure"):
        f = env["failure"]
        rows.append(("failure", f"{f['category']} at {f['stage']}"))
    rows.append(("job", str(env.get("jobId"))))
    sig = env.get("signature")
    if sig:
        signed = "signed by " + ", ".join(sig["keyIds"]) if sig["status"] == "verified" else None
        rows.append(("signature", signed or "NONE: unsigned contract (local development)"))
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


def install_signal_handlers() -> None:
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


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _config_dir() -> Path:
    from runner.client import config_dir

    return Path(config_dir())


def _trusted_keys_dir(arg: str | None) -> Path:
    """--trusted-keys, else $RUNNER_TRUSTED_KEYS, else <config dir>/trusted-keys."""
    if arg:
        return Path(arg)
    if os.environ.get("RUNNER_TRUSTED_KEYS"):
        return Path(os.environ["RUNNER_TRUSTED_KEYS"])
    return _config_dir() / "trusted-keys"


def _policy_path(arg: str | None) -> Path | None:
    """--policy, else $RUNNER_POLICY, else <config dir>/policy.json when it exists."""
    if arg:
        return Path(arg)
    if os.environ.get("RUNNER_POLICY"):
        return Path(os.environ["RUNNER_POLICY"])
    default = _config_dir() / "policy.json"
    return default if default.exists() else None


def _host(args: argparse.Namespace) -> tuple[LoadedPolicy, Trust]:
    """The host's policy (file + operator switches) and its trusted keys."""
    from runner import policy
    from runner.contract import Trust

    loaded = policy.with_switches(
        policy.load(_policy_path(args.policy)),
        network=getattr(args, "allow_network", False) or _env_flag("RUNNER_ALLOW_NETWORK"),
        unsigned=getattr(args, "allow_unsigned", False) or _env_flag("RUNNER_ALLOW_UNSIGNED"),
        unpinned=getattr(args, "allow_unpinned_image", False)
        or _env_flag("RUNNER_ALLOW_UNPINNED_IMAGES"),
    )
    folder = _trusted_keys_dir(args.trusted_keys)
    return loaded, Trust(folder=folder, threshold=loaded.policy.signatureThreshold)


def _overrides(values: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in values:
        key, sep, value = item.partition("=")
        try:
            out[key] = float(value)
        except ValueError:
            _usage(f"--limit wants KEY=NUMBER, got {item!r}")
        if not sep:
            _usage(f"--limit wants KEY=NUMBER, got {item!r}")
    return out


def _runner_key(loaded: LoadedPolicy) -> Path:
    """The runner's own signing key: the policy's resultSigningKey, else
    <config>/runner-key/runner.key (made on first use)."""
    if loaded.policy.resultSigningKey:
        return Path(loaded.policy.resultSigningKey)
    return _config_dir() / "runner-key" / "runner.key"


def _run_options(
    args: argparse.Namespace, loaded: LoadedPolicy, trust: Trust
) -> orchestrator.RunOptions:
    from runner import orchestrator

    return orchestrator.RunOptions(
        state_dir=_state_dir(args.state_dir),
        job_id=args.job_id,
        policy=loaded,
        trust=trust,
        labels=_labels(args.label),
        overrides=_overrides(args.limit),
        rerun=args.rerun,
        bundle=Path(args.bundle) if args.bundle else None,
        result_key=_runner_key(loaded),
        stop_grace_seconds=args.stop_grace,
        heartbeat_seconds=args.heartbeat,
        protected=(_config_dir(),),
    )


_BATCH_EXIT_ORDER = ("cancelled", "infrastructure", "refused", "job_failed", "succeeded")
"""A batch exits with the first of these families that any of its jobs ended in."""


def _run_batch(args: argparse.Namespace, options: orchestrator.RunOptions) -> int:
    from runner import batch, orchestrator

    paths = [Path(c) for c in args.contract]
    parallel = args.parallel or os.cpu_count() or 1
    if parallel < 1:
        _usage(f"--parallel wants a number of jobs of at least 1, got {parallel}")
    finished = 0
    if not args.json:
        print(f"==> batch     {len(paths)} contracts, {parallel} at a time", file=sys.stderr)

    def done(index: int, path: Path, data: dict[str, Any]) -> None:
        nonlocal finished
        finished += 1
        if args.json:
            return
        values = ", ".join(
            f"{m['measurementId']} = {m['value']}" for m in data.get("measurements") or []
        )
        failure = data.get("failure") or {}
        outcome = data["status"]
        if failure:
            reason = str(failure.get("reason") or "").splitlines()[0][:120]
            outcome += f" ({failure['category']}: {reason})"
        print(
            f"[{finished}/{len(paths)}] {path}: {outcome}{': ' + values if values else ''}"
            f"  job {data.get('jobId')}",
            flush=True,
        )

    results = batch.run_many(paths, options, parallel=parallel, on_done=done)
    families = {orchestrator.failure_exit_family_of(data) for data in results}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        tally = ", ".join(
            f"{sum(1 for d in results if d['status'] == status)} {status}"
            for status in sorted({d["status"] for d in results})
        )
        print(f"{len(results)} jobs: {tally}")
    return FAMILY_EXIT[next(f for f in _BATCH_EXIT_ORDER if f in families)]


def cmd_run(args: argparse.Namespace) -> int:
    from runner import orchestrator

    if len(args.contract) > 1 and args.job_id:
        _usage("--job-id names one job: give it with a single CONTRACT")
    try:
        loaded, trust = _host(args)
    except RunnerError as exc:
        # Even a host misconfiguration ends in an envelope under --json.
        envelope = orchestrator.refused(exc, stage="policy")
        if args.json:
            data = orchestrator.as_json(envelope)
            batch = [data] * len(args.contract)
            print(json.dumps(data if len(args.contract) == 1 else batch, indent=2))
        print(f"runner: {exc.category}: {exc}", file=sys.stderr)
        return FAMILY_EXIT[orchestrator.failure_exit_family(envelope)]
    options = _run_options(args, loaded, trust)
    if len(args.contract) > 1:
        return _run_batch(args, options)
    progress = NotesOnly() if args.json else HumanProgress()
    install_signal_handlers()
    envelope = orchestrator.run(Path(args.contract[0]), options, progress=progress)
    if isinstance(progress, HumanProgress):
        progress.done()
    data = orchestrator.as_json(envelope)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        where = Path(envelope.jobDir) / "result.json" if envelope.jobDir else None
        print(_summary(data, where if where and where.exists() else None))
    return FAMILY_EXIT[orchestrator.failure_exit_family(envelope)]


def cmd_serve(args: argparse.Namespace) -> int:
    from runner import client, server

    where = client.socket_path()
    if where is None:
        _usage("RUNNER_SERVER=off: serving is switched off in this environment")
    path = Path(where)
    if len(str(path)) > 100:
        _usage(f"the socket path {path} is too long for a Unix socket; set RUNNER_SERVER")

    def announce(line: str) -> None:
        print(f"runner serve: {line}", file=sys.stderr, flush=True)

    return server.serve(path, dispatch, announce)


def cmd_verify(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from runner import plan, policy
    from runner.contract import load_contract

    loaded, trust = _host(args)
    contract = load_contract(Path(args.contract), trust)
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
        "timeoutSeconds": p.limits.timeout_seconds,
        "network": p.limits.network,
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
        ("command", " ".join(p.argv)),
        ("budget", _fmt_clock(p.limits.timeout_seconds)),
        *(("measurement", line) for line in info["measurements"]),
        ("policy", f"{loaded.source} ({loaded.digest[:19]}…)"),
    ]
    for key, value in rows:
        print(f"  {key:<15} {value}")
    return EXIT_SUCCEEDED


def cmd_keygen(args: argparse.Namespace) -> int:
    from runner import signing

    prefix = Path(args.out)
    private, public = prefix.with_name(prefix.name + ".key"), prefix.with_name(prefix.name + ".pub")
    for path in (private, public):
        if path.exists():
            raise RefusedError(
                f"{path} already exists; keygen never overwrites a key",
                hint="choose another --out, or remove the old pair on purpose",
            )
    keyid = signing.generate_key(private, public)
    result = {"keyId": keyid, "privateKey": str(private), "publicKey": str(public)}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"key id      {keyid}")
        print(f"private key {private} (mode 0600: keep it secret)")
        print(f"public key  {public} (give it to hosts: `runner trust {public}`)")
    return EXIT_SUCCEEDED


def cmd_trust(args: argparse.Namespace) -> int:
    from runner import signing

    key = signing.load_public_key(Path(args.public_key))
    folder = _trusted_keys_dir(args.trusted_keys)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{key.keyid.removeprefix('sha256:')[:32]}.pub"
    data = Path(args.public_key).read_bytes()
    if not target.exists() or target.read_bytes() != data:
        target.write_bytes(data)
    if args.json:
        print(json.dumps({"keyId": key.keyid, "trustedAs": str(target)}, indent=2))
    else:
        print(f"trusted {key.keyid}\n  as {target}")
    return EXIT_SUCCEEDED


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> float:
    unit = text[-1:]
    try:
        if unit in _UNITS:
            return float(text[:-1]) * _UNITS[unit]
        return float(text)
    except ValueError:
        _usage(f"a duration looks like 90s, 30m, 24h or 7d; got {text!r}")


def _read_contract(path: Path) -> dict[str, Any]:
    """An issuer's contract as JSON, before its digest is (re)computed."""
    from runner.contract import parse_json
    from runner.errors import ContractError

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ContractError(f"cannot read {path}: {exc.strerror}", hint="check the path") from exc
    return parse_json(raw, str(path))


def cmd_sign(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime, timedelta

    from runner import signing
    from runner.contract import verify_data, with_digest
    from runner.contract.load import is_envelope

    path = Path(args.contract)
    data = _read_contract(path)
    if is_envelope(data):
        raise RefusedError(f"{path} is already a signed envelope", hint="sign the bare contract")
    now = datetime.now(UTC).replace(microsecond=0)
    if not args.keep_times:
        data["issuedAt"] = now.isoformat().replace("+00:00", "Z")
        data["expiresAt"] = (now + timedelta(seconds=_duration(args.expires_in))).isoformat()
        data["expiresAt"] = data["expiresAt"].replace("+00:00", "Z")
    if args.audience:
        data["audience"] = args.audience
    if args.job_id:
        data["jobId"] = args.job_id
    contract = with_digest(data)
    payload = (json.dumps(contract, indent=2, ensure_ascii=False) + "\n").encode()
    verify_data(contract, payload, path.resolve().parent, str(path))  # schema, digest, parsers
    private = signing.load_private_key(Path(args.key))
    envelope = signing.sign(payload, private)
    out = Path(args.output) if args.output else path.with_name(path.stem + ".dsse.json")
    out.write_text(signing.dumps_envelope(envelope))
    result = {
        "envelope": str(out),
        "keyId": envelope["signatures"][0]["keyid"],
        "contractDigest": contract["contractDigest"],
        "issuedAt": contract.get("issuedAt"),
        "expiresAt": contract.get("expiresAt"),
        "audience": contract.get("audience"),
        "jobId": contract.get("jobId"),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"signed {path} -> {out}")
        for key in ("keyId", "contractDigest", "issuedAt", "expiresAt", "audience", "jobId"):
            if result[key] is not None:
                print(f"  {key:<15} {result[key]}")
    return EXIT_SUCCEEDED


def cmd_pin(args: argparse.Namespace) -> int:
    from runner import backends
    from runner.contract import verify_data, with_digest

    path = Path(args.contract)
    data = _read_contract(path)
    info = backends.default().inspect_image(args.image)
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
    from runner.images import repository_of

    name = repository_of(args.image.split("@", 1)[0])
    digests = [d for d in info.repo_digests if d.split("@", 1)[0] == name]
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


def _job_root(args: argparse.Namespace) -> Path:
    """JOB as a folder path, else a job id under the state dir."""
    given = Path(args.job)
    if (given / "record").is_dir():
        return given
    root: Path = _state_dir(args.state_dir) / "jobs" / str(args.job)
    if not root.is_dir():
        raise RefusedError(
            f"no job {args.job!r} under {root.parent}",
            hint="pass the job id and the same --state-dir as `runner run`, or the job folder",
        )
    return root


def cmd_ledger_verify(args: argparse.Namespace) -> int:
    from runner import ledger

    path = _job_root(args) / "record" / "ledger.jsonl"
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


def cmd_status(args: argparse.Namespace) -> int:
    from runner.ledger import read_state

    root = _job_root(args)
    path = root / "record" / "ledger.jsonl"
    if not path.exists():
        raise RefusedError(f"{path} does not exist: the job never got past its refusal")
    st = read_state(path)  # an onlooker: never repairs or locks a ledger a runner may be writing
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
        from runner.errors import ContainerVanished

        try:
            container_state = backends.default().state(in_flight.container_name).status
        except ContainerVanished:
            container_state = "gone"
    info: dict[str, Any] = {
        "job": root.name,
        "state": state,
        "limitSeconds": st.limit,
        "consumedSeconds": round(st.consumed, 3),
        "remainingSeconds": round(max(st.limit - st.consumed, 0.0), 3),
        "attempts": [
            {
                "attempt": a.number,
                "container": a.container_name,
                "seconds": round(a.seconds, 3),
                "end": (a.finished or {}).get("classification", "in flight"),
                "how": (a.finished or {}).get("how"),
            }
            for a in st.attempts
        ],
        "container": {"name": in_flight.container_name, "state": container_state}
        if in_flight
        else None,
        "envelope": str(root / "result.json") if (root / "result.json").exists() else None,
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return EXIT_SUCCEEDED
    print(f"job        {root.name}  ({state})")
    print(
        f"budget     {_fmt_clock(st.consumed)} used of {_fmt_clock(st.limit)}, "
        f"{_fmt_clock(max(st.limit - st.consumed, 0))} left"
    )
    for a in info["attempts"]:
        how = f" ({a['how']})" if a["how"] else ""
        print(f"attempt {a['attempt']}  {a['seconds']:8.1f} s  {a['end']}{how}  {a['container']}")
    if info["container"]:
        print(f"container  {in_flight.container_name if in_flight else ''}: {container_state}")
    if info["envelope"]:
        print(f"envelope   {info['envelope']}")
    return EXIT_SUCCEEDED


def cmd_cleanup(args: argparse.Namespace) -> int:
    from runner import sweeper

    report = sweeper.sweep(dry_run=args.dry_run)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for item in report["removed"]:
            print(f"removed  {item['name']}  ({item['why']})")
        for item in report["kept"]:
            print(f"kept     {item['name']}  ({item['why']})")
        if not report["removed"] and not report["kept"]:
            print("no containers of this runner on this engine")
    return EXIT_SUCCEEDED


def cmd_parse(args: argparse.Namespace) -> int:
    from runner import orchestrator, policy
    from runner.regrade import regrade

    loaded = policy.load(_policy_path(args.policy))
    envelope = regrade(
        _job_root(args),
        latest=args.latest,
        max_bytes=int(loaded.policy.maxEvidenceMb * 1024 * 1024),
        result_key=_runner_key(loaded),
        max_result_bytes=int(loaded.policy.maxResultKb * 1024),
    )
    data = orchestrator.as_json(envelope)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(f"revision {envelope.revision} of {envelope.jobId}, re-read from stored evidence")
        for change in envelope.regrade.changes if envelope.regrade else []:
            print(f"  changed: {change}")
        print(_summary(data, Path(envelope.jobDir) / "result.json" if envelope.jobDir else None))
    return FAMILY_EXIT[orchestrator.failure_exit_family(envelope)]


def cmd_verify_result(args: argparse.Namespace) -> int:
    from runner import attest, signing

    folder = Path(args.trusted_keys) if args.trusted_keys else _config_dir() / "trusted-runner-keys"
    keys = signing.load_trusted_keys(folder)
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


def cmd_image_load(args: argparse.Namespace) -> int:
    from runner import backends, images

    bundle = Path(args.bundle)
    ids = images.bundle_image_ids(bundle)
    images.load_bundle(backends.default(), bundle, args.expect)
    if args.json:
        print(json.dumps({"bundle": str(bundle), "imageIds": ids}, indent=2))
    else:
        print(f"loaded {bundle}")
        for image_id in ids:
            print(f"  image {image_id}")
    return EXIT_SUCCEEDED


def cmd_parsers(args: argparse.Namespace) -> int:
    from runner.parsers import registry

    items = registry.catalog()
    for name, why in registry.broken().items():
        print(f"runner: parser plug-in {name} failed to load: {why}", file=sys.stderr)
    if args.json:
        print(json.dumps(items, indent=2))
        return EXIT_SUCCEEDED
    for item in items:
        schema = item["configSchema"]
        required = set(schema.get("required", []))
        print(f"{item['id']}@{item['version']}  {item['description']}")
        for name in schema.get("properties", {}):
            print(f"    {name}{' (required)' if name in required else ''}")
    return EXIT_SUCCEEDED


HOST_HELP = """\
host configuration (the host, not the contract, has the last word):
  policy        --policy FILE, else $RUNNER_POLICY, else <config>/policy.json, else defaults
  trusted keys  --trusted-keys DIR, else $RUNNER_TRUSTED_KEYS, else <config>/trusted-keys
  <config> is $RUNNER_CONFIG_DIR, else ~/.config/runner
"""


def _host_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", metavar="FILE", help="host policy file (JSON)")
    p.add_argument("--trusted-keys", metavar="DIR", help="folder of trusted issuer .pub keys")
    p.add_argument(
        "--allow-unsigned",
        action="store_true",
        help="accept an unsigned contract (local development; the envelope says so loudly)",
    )
    p.add_argument(
        "--allow-network",
        action="store_true",
        help="grant network to a contract that asks for it (default: never)",
    )
    p.add_argument(
        "--allow-unpinned-image",
        action="store_true",
        help="accept a tag-only image reference (local development only)",
    )


COMMANDS = frozenset(
    {"run", "verify", "pin", "keygen", "trust", "sign", "parse", "verify-result", "image",
     "status", "ledger", "cleanup", "parsers", "serve"}
)  # fmt: skip
"""The top-level commands (a test keeps this in step with build_parser)."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The CLI; with ``only``, just that command's parser (building all of them costs about
    10 ms of every start-up, mostly argparse's message lookups)."""

    def want(name: str) -> bool:
        return only is None or only == name

    parser = argparse.ArgumentParser(
        prog="runner",
        description=(
            "Run a scientific reproduction exactly as its signed contract says: a pinned image, "
            "a sealed container (no network, read-only inputs, hard caps), and a result "
            "envelope with every measurement traced to its evidence file."
        ),
        epilog=EXIT_CODES_HELP + "\n" + HOST_HELP + "\nexamples:\n"
        "  runner keygen --out issuer                    # issuer.key (0600) + issuer.pub\n"
        "  runner trust issuer.pub                       # this host now trusts that issuer\n"
        "  runner pin task.json --image runner-cpu:local -o pinned.json\n"
        "  runner sign pinned.json --key issuer.key      # -> pinned.dsse.json\n"
        "  runner verify pinned.dsse.json                # who signed, expiry, digest\n"
        "  runner run pinned.dsse.json                   # progress on stderr, table on stdout\n"
        "  runner run pinned.dsse.json --json            # only the envelope, for machines\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    if want("run"):
        run = sub.add_parser(
            "run",
            help="run a contract's job in a container and write its result envelope",
            description=(
                "Verify the contract (signature, digest, schema) and the host policy, stage its "
                "inputs into <state>/jobs/<job id>/, run the pinned image with no network and hard "
                "caps, then read every measurement through its parser. The envelope is written to "
                "<state>/jobs/<job id>/result.json."
            ),
            epilog=EXIT_CODES_HELP + "\n" + HOST_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        run.add_argument(
            "contract",
            metavar="CONTRACT",
            nargs="+",
            help="task.json, or a signed .dsse.json; several run as a batch (see --parallel)",
        )
        run.add_argument(
            "--parallel",
            type=int,
            metavar="N",
            help="with several CONTRACTs: how many run at once (default: the number of CPUs). "
            "Each job runs in its own process forked from this one, so the runner's start-up is "
            "paid once for the whole batch",
        )
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
            "--limit",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="tighten one of the contract's limits (cpus, memoryGb, shmGb, pidsLimit, "
            "timeoutMinutes, tmpfsMb); never loosens it (repeatable)",
        )
        run.add_argument(
            "--rerun",
            action="store_true",
            help="run a job id that already ran to an end again, as a new attempt under the same "
            "budget",
        )
        run.add_argument(
            "--bundle",
            metavar="BUNDLE.tar",
            help="a `docker save` tarball to load the pinned image from when it is not here "
            "(checked to hold the pinned image id before it is loaded)",
        )
        run.add_argument(
            "--heartbeat",
            type=float,
            default=5.0,
            metavar="SECONDS",
            help="how often the budget ledger and runtime-budget.json are updated (default 5)",
        )
        run.add_argument(
            "--stop-grace",
            type=float,
            default=5.0,
            metavar="SECONDS",
            help="seconds between SIGTERM and SIGKILL when stopping the job (default 5)",
        )
        _host_options(run)
        run.set_defaults(func=cmd_run)

    if want("verify"):
        verify = sub.add_parser(
            "verify",
            help="check a contract and this host's policy without running it",
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
        _host_options(verify)
        verify.set_defaults(func=cmd_verify)

    if want("pin"):
        pin = sub.add_parser(
            "pin",
            help="issuer side: pin a local image into a contract and recompute contractDigest",
            description=(
                "Look up a local image, write its manifest digest (when it has one) or image id "
                "into environment.image and its id into environment.imageId, then recompute "
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

    if want("keygen"):
        keygen = sub.add_parser(
            "keygen",
            help="issuer side: make an Ed25519 key pair for signing contracts",
            description="Write PREFIX.key (private, mode 0600) and PREFIX.pub (public). The key id "
            "is sha256 of the raw public key; hosts compute it themselves from PREFIX.pub.",
        )
        keygen.add_argument("--out", required=True, metavar="PREFIX", help="e.g. ~/keys/issuer")
        keygen.add_argument("--json", action="store_true")
        keygen.set_defaults(func=cmd_keygen)

    if want("trust"):
        trust = sub.add_parser(
            "trust",
            help="host side: trust an issuer's public key",
            description="Copy a .pub key into the trusted-keys folder, named by its key id.",
            epilog=HOST_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        trust.add_argument("public_key", metavar="KEY.pub")
        trust.add_argument("--trusted-keys", metavar="DIR", help="folder of trusted keys")
        trust.add_argument("--json", action="store_true")
        trust.set_defaults(func=cmd_trust)

    if want("sign"):
        sign = sub.add_parser(
            "sign",
            help="issuer side: stamp and sign a contract into a DSSE envelope",
            description="Stamp issuedAt (now) and expiresAt (now + --expires-in), optionally "
            "audience and jobId, recompute contractDigest, and sign the exact contract bytes with "
            "Ed25519 into a DSSE envelope (payloadType "
            "application/vnd.citeark.execution-contract+json).",
        )
        sign.add_argument("contract", metavar="CONTRACT")
        sign.add_argument("--key", required=True, metavar="KEY", help="private key from keygen")
        sign.add_argument(
            "-o", "--output", metavar="FILE", help="default: CONTRACT with .dsse.json suffix"
        )
        sign.add_argument(
            "--expires-in",
            default="24h",
            metavar="DURATION",
            help="lifetime from now: 90s, 30m, 24h, 7d (default 24h)",
        )
        sign.add_argument(
            "--keep-times",
            action="store_true",
            help="keep the contract's own issuedAt/expiresAt instead of stamping new ones",
        )
        sign.add_argument(
            "--audience",
            action="append",
            default=[],
            metavar="NAME",
            help="a host audience the contract is for (repeatable)",
        )
        sign.add_argument("--job-id", metavar="ID", help="stamp this job id into the contract")
        sign.add_argument("--json", action="store_true")
        sign.set_defaults(func=cmd_sign)

    if want("parse"):
        parse = sub.add_parser(
            "parse",
            help="re-grade a finished job from its stored evidence, running nothing",
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
        parse.add_argument("--policy", metavar="FILE", help="host policy (evidence size cap, key)")
        parse.add_argument("--json", action="store_true")
        parse.set_defaults(func=cmd_parse)

    if want("verify-result"):
        vres = sub.add_parser(
            "verify-result",
            help="check a signed result (result.intoto.json) and, optionally, its files",
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

    if want("image"):
        image = sub.add_parser("image", help="offline image bundles")
        image_sub = image.add_subparsers(dest="image_command", required=True, metavar="ACTION")
        load = image_sub.add_parser(
            "load",
            help="load a `docker save` bundle, checking the image ids it holds",
            description="Read the bundle's manifest, check each config's SHA-256 (the image id), "
            "refuse it when --expect names an id it lacks, then load it. `docker load` drops repo "
            "digests, so for bundles the image id is the pin.",
        )
        load.add_argument("bundle", metavar="BUNDLE.tar")
        load.add_argument("--expect", metavar="sha256:ID", help="refuse unless it holds this id")
        load.add_argument("--json", action="store_true")
        load.set_defaults(func=cmd_image_load)

    if want("status"):
        status = sub.add_parser(
            "status",
            help="a job's attempts, budget used and left, and its container",
            description="Read a job's ledger: attempts, consumed and remaining budget, the current "
            "state, and (for an attempt in flight) its container as the engine sees it.",
        )
        status.add_argument("job", metavar="JOB", help="job id (under --state-dir) or job folder")
        status.add_argument("--state-dir", metavar="DIR")
        status.add_argument("--json", action="store_true")
        status.set_defaults(func=cmd_status)

    if want("ledger"):
        ledger = sub.add_parser("ledger", help="inspect a job's budget ledger")
        ledger_sub = ledger.add_subparsers(dest="ledger_command", required=True, metavar="ACTION")
        lverify = ledger_sub.add_parser(
            "verify",
            help="check the ledger's hash chain, event order and pairing",
            description="Exit 0 when the ledger is intact, 1 naming each broken line otherwise "
            "(a torn last line included). Changes nothing.",
        )
        lverify.add_argument("job", metavar="JOB", help="job id (under --state-dir) or job folder")
        lverify.add_argument("--state-dir", metavar="DIR")
        lverify.add_argument("--json", action="store_true")
        lverify.set_defaults(func=cmd_ledger_verify)

    if want("cleanup"):
        cleanup = sub.add_parser(
            "cleanup",
            help="remove containers of finished jobs that no runner watches",
            description="Remove containers labelled by this runner whose job has no live runner "
            "and whose ledger says the attempt finished; list (never touch) those whose ledger "
            "says they still run: `runner run` reattaches to them.",
        )
        cleanup.add_argument("--dry-run", action="store_true", help="only list what would go")
        cleanup.add_argument("--json", action="store_true")
        cleanup.set_defaults(func=cmd_cleanup)

    if want("parsers"):
        parsers = sub.add_parser(
            "parsers",
            help="list the registered evidence parsers (id, version, config schema)",
            description="The parser catalog: every registered (id, version), what it reads and "
            "its config fields; --json prints the full config schemas (as "
            "/job/input/parser-catalog.json).",
        )
        parsers.add_argument("action", nargs="?", choices=["list"], default="list")
        parsers.add_argument("--json", action="store_true")
        parsers.set_defaults(func=cmd_parsers)
    if want("serve"):
        serve = sub.add_parser(
            "serve",
            help="keep a warm runner that `runner run` and `runner verify` hand their work to",
            description="Import everything once and listen on a Unix socket "
            "($RUNNER_SERVER, else <config dir>/server.sock; yours alone). While it runs, "
            "`runner run` and `runner verify` on this host hand their command line, working "
            "directory, environment and terminal to it and each runs in a process forked from "
            "it: the same output and exit codes, without the start-up (about 0.3 s a run). "
            "Ctrl-C on a client stops its job; a server running older code is not used. "
            "RUNNER_SERVER=off keeps commands in their own process.",
        )
        serve.set_defaults(func=cmd_serve)
    return parser


def _refusal_exit(exc: RunnerError) -> int:
    from runner.errors import exit_family

    return FAMILY_EXIT[exit_family(exc.category)]


def main(argv: list[str] | None = None) -> NoReturn:
    """The ``runner`` command (``runner.client.main``: a running ``runner serve`` first)."""
    from runner.client import main as client_main

    client_main(argv)


def dispatch(given: list[str]) -> int:
    """Run one command line in this process; its exit code."""
    # pydantic scans every installed package's entry points for its plug-ins on first use
    # (about 20 ms of each start); the runner uses none.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    command = given[0] if given and given[0] in COMMANDS else None
    args = build_parser(only=command).parse_args(given)
    try:
        code: int = args.func(args)
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
    except BrokenPipeError:
        # The reader went away (`runner parsers | head`): not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_SUCCEEDED
    except Exception as exc:  # noqa: BLE001 - a bug is the runner's failure, never the job's
        import traceback

        traceback.print_exc()
        print(
            f"runner: infrastructure: internal error {type(exc).__name__}: {exc}", file=sys.stderr
        )
        code = EXIT_INFRASTRUCTURE
    return code
