"""The command line: the only place that prints or chooses exit codes.

Each command lives in its own module, which declares its parser (``register``) and holds its
command function; the table below says which module has which command, and :func:`dispatch`
imports only the module of the command given (building every parser, and importing every
module's needs, would cost each start-up for nothing). The entry point is
``runner.client:main``, which hands ``run`` and ``verify`` to a running ``runner serve`` first.

===================  ==========================================================
module               commands
===================  ==========================================================
``run.py``           run (one contract, or a batch)
``verify.py``        verify, verify-result
``issuer.py``        keygen, trust, sign, pin
``job.py``           status, ledger verify, cleanup, parse
``image.py``         image load
``gpu.py``           gpu ls, gpu cdi
``fetch.py``         fetch, cache ls, cache prune, cache verify
``render.py``        render (manifests for a cluster: Kubernetes)
``stage.py``         stage (a job's folder laid out, nothing run)
``submit.py``        submit (queue jobs in a cluster: Slurm, Kubernetes)
``wait.py``          wait (for submitted jobs; where each went, for cancel too)
``cancel.py``        cancel (submitted jobs)
``parsers.py``       parsers
``bundle.py``        export, verify-bundle
``schema.py``        schema
``completion.py``    completion
``serve.py``         serve
``_common.py``       exit codes, help texts, host options, progress, the summary
===================  ==========================================================
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from runner.cli._common import (
    EXIT_CANCELLED,
    EXIT_CODES_HELP,
    EXIT_INFRASTRUCTURE,
    EXIT_SUCCEEDED,
    HOST_HELP,
    refusal_exit,
)
from runner.core.errors import RunnerError

_TABLE = {
    "run": ("run", "run a contract's job in a container and write its result envelope"),
    "verify": ("verify", "check a contract and this host's policy without running it"),
    "pin": (
        "issuer",
        "issuer side: pin the inputs' digests and a local image into a contract",
    ),
    "keygen": ("issuer", "issuer side: make an Ed25519 key pair for signing contracts"),
    "trust": ("issuer", "host side: trust an issuer's public key"),
    "sign": ("issuer", "issuer side: stamp and sign a contract into a DSSE envelope"),
    "parse": ("job", "re-grade a finished job from its stored evidence, running nothing"),
    "verify-result": (
        "verify",
        "check a signed result (a job folder, result.json or result.intoto.json) and its files",
    ),
    "export": ("bundle", "write a job's run as one archive anyone can verify offline"),
    "verify-bundle": (
        "bundle",
        "check an exported run offline: signatures, every hash, the ledger, the values",
    ),
    "stage": (
        "stage",
        "lay out a contract's job folder as `runner run` would, running nothing",
    ),
    "render": (
        "render",
        "write the manifests for a cluster to run a contract's job (Kubernetes)",
    ),
    "submit": (
        "submit",
        "queue contracts' jobs in a cluster: Slurm (`runner run` on a node), or Kubernetes",
    ),
    "wait": ("wait", "wait for submitted jobs to end; exit as `runner run` would have"),
    "cancel": ("cancel", "cancel submitted jobs (scancel, or delete the Kubernetes Job)"),
    "image": ("image", "offline image bundles"),
    "gpu": ("gpu", "this host's GPUs, and a CDI spec that hands them to containers"),
    "fetch": ("fetch", "fetch a contract's assets into this host's cache, verified"),
    "cache": (
        "fetch",
        "the asset and input caches: list, prune (never what a running job uses), verify",
    ),
    "status": ("job", "a job's attempts, budget used and left, and its container"),
    "ledger": ("job", "inspect a job's budget ledger"),
    "cleanup": (
        "job",
        "remove containers of finished jobs that no runner watches, and free egress slots",
    ),
    "parsers": ("parsers", "list the registered evidence parsers (id, version, config schema)"),
    "schema": ("schema", "print the JSON Schema of a contract, policy, envelope or result.json"),
    "completion": ("completion", "print a bash, zsh or tcsh completion script"),
    "serve": (
        "serve",
        "keep a warm runner that `runner run` and `runner verify` hand their work to",
    ),
}
"""Command -> (module under runner/cli/, the one line ``runner --help`` lists it with), in the
order ``runner --help`` lists them. The module's ``register(subparsers, command, help)``
declares the command's parser and sets its function as ``func``."""

COMMANDS = frozenset(_TABLE)
"""The top-level commands (a test keeps this in step with build_parser)."""

DESCRIPTION = (
    "Run a scientific reproduction exactly as its signed contract says: a pinned image, "
    "a sealed container (no network, read-only inputs, hard caps), and a result "
    "envelope with every measurement traced to its evidence file."
)

EXAMPLES = (
    "\nexamples:\n"
    "  runner keygen --out issuer                    # issuer.key (0600) + issuer.pub\n"
    "  runner trust issuer.pub                       # this host now trusts that issuer\n"
    "  runner pin task.json --image runner-cpu:local -o pinned.json\n"
    "  runner sign pinned.json --key issuer.key      # -> pinned.dsse.json\n"
    "  runner verify pinned.dsse.json                # who signed, expiry, digest\n"
    "  runner run pinned.dsse.json                   # progress on stderr, table on stdout\n"
    "  runner run pinned.dsse.json --json            # only the envelope, for machines\n"
)


def _module(name: str) -> Any:
    """The module of command ``name``. (``__import__`` rather than importlib.import_module:
    the same import, but ``python -X importtime`` sees it.)"""
    return __import__(f"runner.cli.{_TABLE[name][0]}", fromlist=["register"])


def load_all() -> None:
    """Import every command's module (``runner serve`` does, so that no command forked from
    it pays for its own)."""
    for name in _TABLE:
        _module(name)


def build_parser(only: str | None = None, *, listing: bool = False) -> argparse.ArgumentParser:
    """The CLI; with ``only``, just that command's parser (building all of them costs about
    10 ms of every start-up, mostly argparse's message lookups, and importing every command's
    module). With ``listing``, every command is only named, with its line of help: enough for
    ``runner --help`` and for any command line that names no command."""
    parser = argparse.ArgumentParser(
        prog="runner",
        description=DESCRIPTION,
        epilog=EXIT_CODES_HELP + "\n" + HOST_HELP + EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-V",
        "--version",
        action="store_true",
        help="print the runner's, Python's and the engine API's versions (with --json: as "
        "JSON) and exit",
    )
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="log what the runner does on stderr from this level (default: no log; "
        "$RUNNER_LOG_LEVEL); may also follow the command",
    )
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        help="text (default), or json: one object per line with ts, level, event, jobId, "
        "stage, attempt, category ($RUNNER_LOG_FORMAT)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, line) in _TABLE.items():
        if listing:
            sub.add_parser(name, help=line)
        elif only is None or only == name:
            _module(name).register(sub, name, line)
    return parser


def version_info(*, engine: bool = True) -> dict[str, Any]:
    """What ``runner --version`` says: this runner, its Python, and the engine API it speaks
    (and the engine's, when one answers within a second)."""
    import platform

    from runner._version import DISTRIBUTION, __version__

    info: dict[str, Any] = {
        "runner": __version__,
        "distribution": DISTRIBUTION,
        "python": platform.python_version(),
        "dockerSdk": None,
        "engineApiDefault": None,
        "engine": None,
    }
    if not engine:
        return info
    try:
        import docker
        from docker import constants
    except ImportError:
        return info
    info["dockerSdk"] = docker.__version__
    info["engineApiDefault"] = constants.DEFAULT_DOCKER_API_VERSION
    try:
        client = docker.from_env(timeout=1)
        v = client.version()
        info["engine"] = {"version": v.get("Version"), "apiVersion": v.get("ApiVersion")}
    except Exception as exc:  # noqa: BLE001 - an absent engine is an answer here, not an error
        info["engine"] = {"error": f"not reachable ({type(exc).__name__})"}
    return info


def _print_version(as_json: bool) -> int:
    info = version_info()
    if as_json:
        print(json.dumps(info, indent=2))
        return EXIT_SUCCEEDED
    engine = info["engine"] or {}
    said = (
        f"engine {engine['version']} (API {engine['apiVersion']})"
        if "version" in engine
        else f"engine {engine.get('error', 'unknown')}"
    )
    print(
        f"runner {info['runner']} ({info['distribution']}), Python {info['python']}, "
        f"docker SDK {info['dockerSdk']} (API {info['engineApiDefault']}), {said}"
    )
    return EXIT_SUCCEEDED


def _logging_options(given: list[str]) -> list[str]:
    """Take ``--log-level`` and ``--log-format`` from anywhere before ``--`` (else
    ``$RUNNER_LOG_LEVEL``, ``$RUNNER_LOG_FORMAT``), set the log up, and return the rest."""
    from runner.core import log

    chosen: dict[str, str | None] = {
        "--log-level": os.environ.get("RUNNER_LOG_LEVEL"),
        "--log-format": os.environ.get("RUNNER_LOG_FORMAT"),
    }
    rest: list[str] = []
    it = iter(given)
    for arg in it:
        if arg == "--":
            rest.append(arg)
            rest.extend(it)
            break
        name, eq, value = arg.partition("=")
        if name in chosen:
            chosen[name] = value if eq else next(it, None)
        else:
            rest.append(arg)
    for name, allowed in (("--log-level", log.LEVELS), ("--log-format", log.FORMATS)):
        given_value = chosen[name]
        if given_value is not None and given_value.lower() not in allowed:
            print(
                f"runner: {name} wants one of {', '.join(allowed)}, got {given_value!r}",
                file=sys.stderr,
            )
            raise SystemExit(2)
    level, fmt = chosen["--log-level"], chosen["--log-format"]
    log.configure(level.lower() if level else None, fmt.lower() if fmt else None)
    return rest


def dispatch(given: list[str]) -> int:
    """Run one command line in this process; its exit code."""
    given = _logging_options(given)
    if given and given[0] in ("--version", "-V"):
        return _print_version("--json" in given[1:])
    # pydantic scans every installed package's entry points for its plug-ins on first use
    # (about 20 ms of each start); the runner uses none.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    command = given[0] if given and given[0] in COMMANDS else None
    # A command line that names no command at all ends in help or a usage error, which the
    # listing alone gives exactly; one that names a command later (`runner --x run`) gets it all.
    listing = command is None and COMMANDS.isdisjoint(given)
    args = build_parser(only=command, listing=listing).parse_args(given)
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
        code = refusal_exit(exc)
    except KeyboardInterrupt:
        print("runner: interrupted", file=sys.stderr)
        code = EXIT_CANCELLED
    except BrokenPipeError:  # before OSError, its base
        # The reader went away (`runner parsers | head`): not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_SUCCEEDED
    except OSError as exc:
        # A file the command reads or writes (a key, a contract, an -o path): the host's
        # answer, said in one line, not a traceback.
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"runner: infrastructure: {where}{exc.strerror or exc}", file=sys.stderr)
        code = EXIT_INFRASTRUCTURE
    except Exception as exc:  # noqa: BLE001 - a bug is the runner's failure, never the job's
        import traceback

        traceback.print_exc()
        print(
            f"runner: infrastructure: internal error {type(exc).__name__}: {exc}", file=sys.stderr
        )
        code = EXIT_INFRASTRUCTURE
    return code
