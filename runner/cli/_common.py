"""What the commands share: exit codes and the failure-family mapping, help texts, the host
options, usage errors, progress for people and the result summary.

Exit codes come from the category table (:mod:`runner.core.errors`, which ``runner.cli`` imports
at start-up for :func:`~runner.cli.dispatch`'s ``except RunnerError``). The ``EXIT_*``
constants and the help text agree with that table (a test checks them).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

    from runner.contract import Trust
    from runner.core.errors import RunnerError
    from runner.execution.options import RunOptions
    from runner.models.envelope import ResultEnvelope
    from runner.planning.policy import LoadedPolicy
    from runner.trust.signing import TrustedKey

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]
    """What each command module's ``register`` adds its parser to."""

EXIT_SUCCEEDED = 0
EXIT_JOB_FAILED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_INFRASTRUCTURE = 4
EXIT_NOT_FOUND = 5
EXIT_CANCELLED = 130

EXIT_CODES_HELP = """\
exit codes:
  0    the job succeeded (every measurement was read)
  1    the job ran and failed: non-zero exit, OOM, timeout, missing or unparseable evidence
       (also a 'partial' result, where some measurements were read)
  2    the command line was wrong
  3    refused before anything ran: invalid contract, bad or missing signature, policy
       violation, ambiguous protocol, image digest mismatch; (job export, verify bundle) a
       bundle that cannot be made or does not verify; (report) no envelope to show
  4    infrastructure: the engine is unreachable, the image is not here, no GPU to give,
       the host's policy or keys are broken, the runner failed
  5    no such job: the job id or folder given (job status|regrade|export, verify ledger,
       report) is not here
  (a job that already finished prints its stored envelope and exits with its code)
  130  interrupted (Ctrl-C or SIGTERM); the container was stopped and an envelope written
"""


def exit_code_of(category: str | None) -> int:
    """The exit code of a failure category (None: success), from the category table."""
    from runner.core.errors import family_of

    return family_of(category).code


def envelope_exit(envelope: ResultEnvelope) -> int:
    return exit_code_of(envelope.failure.category if envelope.failure else None)


def batch_exit(envelopes: list[dict[str, Any]]) -> int:
    """A batch exits with the first family, in the table's order of precedence (cancelled,
    infrastructure, refused, job failed, succeeded), that any of its jobs ended in."""
    from runner.core.errors import Family, family_of

    ended = {family_of((data.get("failure") or {}).get("category")) for data in envelopes}
    return next(f for f in Family if f in ended).code


def refusal_exit(exc: RunnerError) -> int:
    """The exit code of an error raised outside a run."""
    return exit_code_of(exc.category)


HOST_HELP = """\
host configuration (the host, not the contract, has the last word):
  policy        --policy FILE, else $RUNNER_POLICY, else <config>/policy.json, else defaults
  trusted keys  --trusted-keys DIR, else $RUNNER_TRUSTED_KEYS, else <config>/trusted-keys
  <config> is $RUNNER_CONFIG_DIR, else ~/.config/runner
"""


def host_options(p: argparse.ArgumentParser) -> None:
    """--policy, --trusted-keys and the operator's switches (run, verify)."""
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


def load_host(args: argparse.Namespace) -> tuple[LoadedPolicy, Trust]:
    """The host's policy (file + operator switches) and its trusted keys, from host_options."""
    from runner.app import host

    return host.load(
        args.policy,
        args.trusted_keys,
        allow_network=getattr(args, "allow_network", False),
        allow_unsigned=getattr(args, "allow_unsigned", False),
        allow_unpinned_image=getattr(args, "allow_unpinned_image", False),
    )


def labels(values: list[str]) -> dict[str, str]:
    """``--label KEY=VALUE`` options (run, replay): the org.runner. labels are the runner's."""
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            usage(f"--label wants KEY=VALUE, got {item!r}")
        if key.startswith("org.runner."):
            usage(f"--label {key}: the org.runner. labels are the runner's own")
        out[key] = value
    return out


def host_run_options(
    loaded: LoadedPolicy,
    trust: Trust,
    *,
    state_dir: str | None,
    stop_grace: float,
    heartbeat: float,
    **fields: Any,
) -> RunOptions:
    """How a job runs on this host (run, replay): the policy, trusted keys and state folder
    given, and the host's own settings (its result key, its GPU locks and CDI specs, its config
    folder kept out of every job, Slurm asked before a takeover of an attempt it ran);
    ``fields`` sets the rest of :class:`RunOptions`."""
    from pathlib import Path

    from runner.app import host
    from runner.execution.options import RunOptions
    from runner.scheduling.slurm.fence import SlurmFence

    return RunOptions(
        state_dir=host.state_dir(state_dir),
        policy=loaded,
        trust=trust,
        result_key=host.result_key_path(loaded.policy.resultSigningKey),
        stop_grace_seconds=stop_grace,
        heartbeat_seconds=heartbeat,
        protected=(Path(host.config_dir()),),
        gpu_lock_dir=host.gpu_lock_dir(),
        cdi_dirs=host.cdi_dirs(),
        scheduler=SlurmFence(),  # asked only in a takeover of an attempt run under Slurm
        **fields,
    )


HEARTBEAT_SECONDS = 5.0
"""``runner run --heartbeat``'s default (and so the node's runner's, under ``cluster submit``)."""

LEASE_MIN_SECONDS = 10.0
"""The shortest ``--lease`` a host may choose."""


def checked_lease(lease: float | None, heartbeat: float) -> float | None:
    """``--lease`` as given (None: the default), refused (exit 2) when under three heartbeats
    or :data:`LEASE_MIN_SECONDS`: the runner would take its own slow moment for a lost lease."""
    if lease is None:
        return None
    least = max(3 * heartbeat, LEASE_MIN_SECONDS)
    if not lease >= least:  # NaN too
        usage(
            f"--lease {lease:g}: at least three heartbeats (--heartbeat {heartbeat:g}) and "
            f"{LEASE_MIN_SECONDS:g} s, so at least {least:g}"
        )
    return lease


def usage(message: str) -> NoReturn:
    """A command-line mistake: say so and exit 2, as argparse does."""
    print(f"runner: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def own_runner_keys() -> list[TrustedKey]:
    """The runner keys a host trusts when none are named: its own (the policy's
    ``resultSigningKey``, else ``<config>/runner-key/runner.pub``) and
    ``<config>/trusted-runner-keys``; each key's ``source`` says which."""
    from dataclasses import replace
    from pathlib import Path

    from runner.app import host
    from runner.planning import policy
    from runner.trust import signing

    loaded = policy.load(host.policy_path(None))
    own = Path(host.result_key_path(loaded.policy.resultSigningKey)).with_suffix(".pub")
    keys = [signing.load_public_key(own)] if own.is_file() else []
    labelled = [replace(k, source=f"this host's runner key {k.source}") for k in keys]
    others = signing.load_trusted_keys(host.trusted_runner_keys_dir())
    return labelled + [replace(k, source=f"trusted runner key {k.source}") for k in others]


RESULT_KEYS_FLAG = "--result-keys"
"""The folder of keys trusted to sign results (runner keys), on every command that checks a
signed result. ``--trusted-keys`` always names issuer (contract signer) keys."""


def result_key_options(p: argparse.ArgumentParser) -> None:
    """--key and --result-keys: the runner keys trusted to sign results (verify result,
    verify bundle)."""
    p.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="PUB",
        help="trust this runner public key for results (repeatable); then only the keys named are",
    )
    p.add_argument(
        RESULT_KEYS_FLAG,
        metavar="DIR",
        help="trust the runner keys in DIR for results (e.g. <config>/trusted-runner-keys); "
        "then only the keys named are",
    )


def named_result_keys(args: argparse.Namespace) -> tuple[list[TrustedKey], bool]:
    """The runner keys trusted to sign results: those named by --key and --result-keys, else
    this host's (:func:`own_runner_keys`); and whether they are this host's defaults."""
    from dataclasses import replace
    from pathlib import Path

    from runner.app import host
    from runner.trust import signing

    if args.result_keys == "":
        usage(f"{RESULT_KEYS_FLAG} wants a folder of trusted runner .pub keys")
    if not args.key and args.result_keys is None:
        return own_runner_keys(), True
    keys = [replace(signing.load_public_key(Path(p)), source=f"--key {p}") for p in args.key]
    if args.result_keys:
        folder = host.trusted_runner_keys_dir(args.result_keys)
        keys += [
            replace(k, source=f"trusted runner key {k.source}")
            for k in signing.load_trusted_keys(folder)
        ]
    return keys, False


def fmt_clock(seconds: float) -> str:
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
        text = f"    running  {fmt_clock(elapsed)} of {fmt_clock(budget)} budget"
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


def summary(env: dict[str, Any], path: Path | None) -> str:
    """A result envelope (as JSON data) for people: a few rows, the measurements' table."""
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
    agent = env.get("agent")
    if agent:
        brought = agent.get("agentRuntime")
        where = (
            f"commands in the contract's image, runtime from {brought['image']['id']}"
            if brought
            else "commands in the adapter's image (runIn adapter-image)"
        )
        rows.append(("agent", f"{agent['runtime']}: {where}"))
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
