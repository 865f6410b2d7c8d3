"""The command line: the only place that prints a command's answer or chooses its exit code.
(``runner.client`` and ``runner.app.server``, which hand a command to a running server, print
only about that hand-off; ``python -m runner.app.schemas`` is a maintainer's tool.)

The commands are grouped by what they act on (``runner verify contract``, ``runner job
status``, ``runner cluster submit``, ``runner cache ls``); ``runner run`` stays a verb of its
own, the command a person runs most. Each command lives in a module, which declares its parser
(``register``) and holds its command function; the tables below say which module has which
command, and :func:`dispatch` imports only the module of the command given (building every
parser, and importing every module's needs, would cost each start-up for nothing). The
``runner`` command (the entry point ``runner.client:main``) hands ``run`` and ``verify
contract`` to a running ``runner serve`` first.

The earlier, flat spellings (``runner verify-result``, ``runner status``, ``runner submit``)
stay valid for good: :data:`ALIASES` rewrites a command line's first words into the grouped
spelling before it is parsed, so both reach the same parser, options and exit codes.

===================  ==========================================================
module               commands
===================  ==========================================================
``run.py``           run (one contract, or a batch)
``replay.py``        replay (a finished job's contract again, compared with it)
``verify.py``        verify contract, verify result
``issuer.py``        key new, key trust, contract pin, contract sign
``job.py``           job status, job regrade, job cleanup, verify ledger
``image.py``         image load
``gpu.py``           gpu ls, gpu cdi
``fetch.py``         cache fetch, cache ls, cache prune, cache verify
``render.py``        cluster render (manifests for a cluster: Kubernetes)
``stage.py``         cluster stage (a job's folder laid out, nothing run)
``submit.py``        cluster submit (queue jobs in a cluster: Slurm, Kubernetes)
``wait.py``          job wait (for submitted jobs; where each went, for cancel too)
``cancel.py``        job cancel (submitted jobs)
``parsers.py``       parsers
``bundle.py``        job export, verify bundle
``report.py``        report (a run's HTML page, from a job folder or a bundle)
``schema.py``        schema
``completion.py``    completion
``serve.py``         serve
``_common.py``       exit codes, help texts, host options, progress, the summary
===================  ==========================================================

Long on purpose: the tables of commands, groups and earlier spellings, the parser built from
them and the dispatch are one idea (which module answers which command line), read together.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from runner.cli._common import (
    EXIT_CANCELLED,
    EXIT_CODES_HELP,
    EXIT_INFRASTRUCTURE,
    EXIT_SUCCEEDED,
    HOST_HELP,
    refusal_exit,
)
from runner.core import collector
from runner.core.errors import RunnerError

if TYPE_CHECKING:
    from runner.cli._common import Subparsers

__all__ = [
    "ALIASES",
    "COMMANDS",
    "EXIT_CODES_HELP",
    "HOST_HELP",
    "build_parser",
    "dispatch",
    "load_all",
    "spelled",
    "warm_served_parsers",
]

_TABLE: dict[str, tuple[str | None, str]] = {
    "run": ("run", "run a contract's job in a container and write its envelope"),
    "replay": ("replay", "run a finished job's contract again N times; how reproducible it is"),
    "verify": (None, "check, running nothing"),
    "contract": (None, "the issuer's side of a contract"),
    "key": (None, "the keys contracts are signed with"),
    "job": (None, "a job"),
    "cluster": (None, "jobs for Slurm or Kubernetes"),
    "report": ("report", "one self-contained HTML page of a run (job folder or bundle)"),
    "cache": ("fetch", "the asset and input caches: fetch | ls | prune | verify"),
    "image": ("image", "offline image bundles: load"),
    "gpu": ("gpu", "this host's GPUs: ls | cdi (a spec for containers)"),
    "parsers": ("parsers", "list the registered evidence parsers (id, version, config)"),
    "schema": ("schema", "the JSON Schemas of contract, policy, envelope, result.json"),
    "completion": ("completion", "print a bash, zsh or tcsh completion script"),
    "serve": ("serve", "a warm runner that `run` and `verify contract` hand work to"),
}
"""Top-level command -> (its module under runner/cli/, or None for a group of commands made
here from :data:`_GROUPS`; the one line ``runner --help`` lists it with, which for a group goes
on to name its commands), in the order ``runner --help`` lists them. A module's
``register(subparsers, command, help)`` declares the command's parser (for ``cache``,
``image`` and ``gpu``: the group and its actions) and sets its function as ``func``."""

_GROUPS: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "verify": (
        "Check something without running it: exit 0 when it holds, non-zero otherwise.",
        {
            "contract": (
                "verify",
                "a contract and this host's policy: would this host run it",
            ),
            "result": (
                "verify",
                "a signed result (job folder or result.json) and its files",
            ),
            "bundle": (
                "bundle",
                "an exported run, offline: signatures, hashes, ledger, values",
            ),
            "ledger": ("job", "a job's budget ledger: its hash chain, event order and pairing"),
        },
    ),
    "contract": (
        "The issuer's side of a contract: bind its inputs and image, then sign it.",
        {
            "pin": ("issuer", "pin the inputs' digests and a local image into a contract"),
            "sign": ("issuer", "stamp and sign a contract into a DSSE envelope"),
        },
    ),
    "key": (
        "The Ed25519 keys contracts are signed with: an issuer makes a pair, a host\n"
        "trusts its public half.",
        {
            "new": ("issuer", "issuer side: make an Ed25519 key pair for signing contracts"),
            "trust": ("issuer", "host side: trust an issuer's public key"),
        },
    ),
    "job": (
        "A job once it has started, here or in a cluster: named by its job id (and\n"
        "--state-dir) or its folder.",
        {
            "status": ("job", "a job's attempts, budget used and left, and its container"),
            "wait": ("wait", "wait for submitted jobs to end; exit as `runner run` would have"),
            "cancel": ("cancel", "cancel submitted jobs (scancel, or delete the Kubernetes Job)"),
            "regrade": ("job", "re-grade a finished job from its stored evidence"),
            "export": ("bundle", "write a job's run as one archive anyone can verify offline"),
            "cleanup": (
                "job",
                "remove finished jobs' containers; free egress slots",
            ),
        },
    ),
    "cluster": (
        "Running contracts' jobs in a cluster: Slurm (`runner run` on a node) or\n"
        "Kubernetes. `runner job wait|cancel|status` follow them there.",
        {
            "submit": (
                "submit",
                "queue jobs in Slurm (`runner run` on a node) or Kubernetes",
            ),
            "render": (
                "render",
                "write the manifests for Kubernetes to run a contract's job",
            ),
            "stage": (
                "stage",
                "lay out a contract's job folder as `run` would; run nothing",
            ),
        },
    ),
}
"""Group -> (its description, {action: (module, the one line its group's help lists it
with)}), for the groups made here; a module's ``register`` is given the action's name."""

ALIASES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("verify",): ("verify", "contract"),
    ("verify-result",): ("verify", "result"),
    ("verify-bundle",): ("verify", "bundle"),
    ("ledger", "verify"): ("verify", "ledger"),
    ("ledger",): ("verify", "ledger"),
    ("pin",): ("contract", "pin"),
    ("sign",): ("contract", "sign"),
    ("keygen",): ("key", "new"),
    ("trust",): ("key", "trust"),
    ("status",): ("job", "status"),
    ("wait",): ("job", "wait"),
    ("cancel",): ("job", "cancel"),
    ("parse",): ("job", "regrade"),
    ("export",): ("job", "export"),
    ("cleanup",): ("job", "cleanup"),
    ("submit",): ("cluster", "submit"),
    ("render",): ("cluster", "render"),
    ("stage",): ("cluster", "stage"),
    ("fetch",): ("cache", "fetch"),
}
"""The earlier, flat spellings (first words of a command line) -> the grouped ones; scripts
written for them keep working. ``verify X`` is ``verify contract X`` unless X is one of
``verify``'s own actions (or -h/--help); ``ledger`` alone is ``verify ledger`` (its ``--help``
as before)."""

COMMANDS = frozenset(_TABLE)
"""The top-level commands (a test keeps this in step with build_parser)."""

_RESUMED_LATER = frozenset({("run", None), ("verify", "contract")})
"""Commands whose imports are most of their time: the garbage collector held off since the
process started (:mod:`runner.core.collector`) is let run again once they are done, by
``runner run`` before its job and by the command line's entry as ``verify contract`` ends;
every other command's is let run before it starts."""

DESCRIPTION = (
    "Run a scientific reproduction exactly as its signed contract says: a pinned image, "
    "a sealed container (no network, read-only inputs, hard caps), and a result "
    "envelope with every measurement traced to its evidence file."
)

EXAMPLES = (
    "\nexamples:\n"
    "  runner key new --out issuer                   # issuer.key (0600) + issuer.pub\n"
    "  runner key trust issuer.pub                   # this host now trusts that issuer\n"
    "  runner contract pin task.json --image runner-cpu:local -o pinned.json\n"
    "  runner contract sign pinned.json --key issuer.key   # -> pinned.dsse.json\n"
    "  runner verify contract pinned.dsse.json       # who signed, expiry, digest\n"
    "  runner run pinned.dsse.json                   # progress on stderr, table on stdout\n"
    "  runner run pinned.dsse.json --json            # only the envelope, for machines\n"
    "  runner job status JOB                         # attempts, budget, container\n"
    "  runner verify result JOB_FOLDER               # its signed result and files\n"
    "  runner job --help                             # a group's commands\n"
)


def _module(module: str) -> Any:
    """The command module ``module`` under runner/cli/. (``__import__`` rather than
    importlib.import_module: the same import, but ``python -X importtime`` sees it.)"""
    return __import__(f"runner.cli.{module}", fromlist=["register"])


def load_all() -> None:
    """Import every command's module (``runner serve`` does, so that no command forked from
    it pays for its own)."""
    for module, _ in _TABLE.values():
        if module is not None:
            _module(module)
    for _, actions in _GROUPS.values():
        for module, _ in actions.values():
            _module(module)


def spelled(given: list[str]) -> list[str]:
    """``given`` in the grouped spelling: the first words of an earlier spelling (see
    :data:`ALIASES`, longest first) replaced; anything else as it is."""
    for old in sorted(ALIASES, key=len, reverse=True):
        if tuple(given[: len(old)]) != old:
            continue
        new, rest = ALIASES[old], given[len(old) :]
        if new[: len(old)] == old and (
            not rest or rest[0] in _GROUPS[old[0]][1] or rest[0] in ("-h", "--help")
        ):
            return given  # the group itself (`verify result X`, `verify --help`)
        return [*new, *rest]
    return given


def _spellings_of(group: str | None) -> str:
    """The help's lines of earlier spellings (of one group's commands, or of all)."""
    pairs = [
        f"{' '.join(old)} = {' '.join(new)}"
        for old, new in ALIASES.items()
        if old != ("ledger",) and (group is None or new[0] == group)  # `ledger verify` says it
    ]
    lines, line = [], " "
    for pair in pairs:
        if len(line) + len(pair) + 2 > 90:
            lines.append(line.rstrip(","))
            line = " "
        line += f" {pair},"
    lines.append(line.rstrip(","))
    return "earlier spellings (still accepted, the same options and exit codes):\n" + "\n".join(
        lines
    )


def _group(sub: Subparsers, name: str, line: str, *, action: str | None, listing: bool) -> None:
    """Group ``name`` of :data:`_GROUPS`: every action's parser, or only ``action``'s, or
    (``listing``) every action only named with its line."""
    description, actions = _GROUPS[name]
    group = sub.add_parser(
        name,
        help=line,
        description=description,
        epilog=_spellings_of(name),
        formatter_class=_Formatter,
    )
    inner = group.add_subparsers(dest=f"{name}_command", required=True, metavar="ACTION")
    for act, (module, act_line) in actions.items():
        if listing:
            inner.add_parser(act, help=act_line)
        elif action is None or action == act:
            _module(module).register(inner, act, act_line)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """The help's layout: command names are short, so their lines start at column 18 and
    mostly fit on one line (argparse's default is 24)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=18)


_BUILT: dict[tuple[str | None, str | None, bool], argparse.ArgumentParser] = {}
"""Parsers built in this process, by ``build_parser``'s arguments: parsing a command line
never changes one, and a fork of ``runner serve`` finds its command's built already
(:func:`warm_served_parsers`) instead of paying a millisecond or two of argparse for it."""


def build_parser(
    only: str | None = None, *, action: str | None = None, listing: bool = False
) -> argparse.ArgumentParser:
    """The CLI; with ``only``, just that top-level command's parser (building all of them costs
    about 10 ms of every start-up, mostly argparse's message lookups, and importing every
    command's module), and with ``action`` too, just that command of the group ``only``. With
    ``listing``, the commands of the last level built (the top level, or the group ``only``)
    are only named, with their lines of help: enough for ``runner --help``, ``runner job
    --help``, and any command line that names no command of that level. Built once a
    process for the same arguments (the caller must not change it)."""
    key = (only, action, listing)
    if key not in _BUILT:
        _BUILT[key] = _build(only, action, listing)
    return _BUILT[key]


def warm_served_parsers() -> None:
    """Build the parsers of the command lines a server's clients hand over (``runner run``,
    ``runner verify contract``; runner.app.host.served) in the server, before it forks."""
    build_parser(only="run")
    build_parser(only="verify", action="contract")


def _build(only: str | None, action: str | None, listing: bool) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runner",
        description=DESCRIPTION,
        epilog=EXIT_CODES_HELP + "\n" + HOST_HELP + EXAMPLES + "\n" + _spellings_of(None),
        formatter_class=_Formatter,
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
    for name, (module, line) in _TABLE.items():
        if name in _GROUPS:
            line = f"{line}: {' | '.join(_GROUPS[name][1])}"
        if listing and only is None:
            sub.add_parser(name, help=line)
        elif only is None or only == name:
            if module is None:
                _group(sub, name, line, action=action, listing=listing)
            else:
                _module(module).register(sub, name, line)
    return parser


def version_info(*, engine: bool = True) -> dict[str, Any]:
    """What ``runner --version`` says: this runner, its Python, the docker SDK it moves images
    with, the newest engine API its own requests speak, and the engine's version (when one
    answers within a second). The engine is asked over the runner's own transport and the
    SDK's version read from its metadata: importing the SDK (with requests and urllib3) would
    cost more than the rest of the command."""
    import platform
    from importlib import metadata

    from runner._version import DISTRIBUTION, __version__
    from runner.backends.docker import MAX_API_VERSION, DockerBackend

    try:
        sdk: str | None = metadata.version("docker")
    except metadata.PackageNotFoundError:
        sdk = None
    info: dict[str, Any] = {
        "runner": __version__,
        "distribution": DISTRIBUTION,
        "python": platform.python_version(),
        "dockerSdk": sdk,
        "engineApiDefault": MAX_API_VERSION,
        "engine": None,
    }
    if not engine:
        return info
    try:
        said = DockerBackend(timeout=1).engine()  # printable, cut short (engine_text)
        info["engine"] = {"version": said.version or None, "apiVersion": said.api_version or None}
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
        f"docker SDK {info['dockerSdk']}, engine API up to {info['engineApiDefault']}, {said}"
    )
    return EXIT_SUCCEEDED


def _logging_options(given: list[str]) -> list[str]:
    """Take ``--log-level`` and ``--log-format`` from anywhere before ``--`` (else
    ``$RUNNER_LOG_LEVEL``, ``$RUNNER_LOG_FORMAT``), set the log up, and return the rest."""
    from runner.app.host import split_logging_options
    from runner.core import log

    named, rest = split_logging_options(given)
    chosen: dict[str, str | None] = {
        "--log-level": os.environ.get("RUNNER_LOG_LEVEL"),
        "--log-format": os.environ.get("RUNNER_LOG_FORMAT"),
        **named,
    }
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
    given = spelled(given)
    command = given[0] if given and given[0] in COMMANDS else None
    actions = _GROUPS[command][1] if command in _GROUPS else {}
    action = given[1] if len(given) > 1 and given[1] in actions else None
    # A command line that names no command at all ends in help or a usage error, which the
    # listing alone gives exactly; one that names a command later (`runner --x run`) gets it all.
    # The same for a group's line that names none of its commands (`runner job --help`).
    listing = (command is None and COMMANDS.isdisjoint(given)) or (bool(actions) and not action)
    args = build_parser(only=command, action=action, listing=listing).parse_args(given)
    for name, value in vars(args).items():  # an unused repeatable option's value is the
        if isinstance(value, list):  # parser's own default list: a command changing it would
            setattr(args, name, list(value))  # change the next parse of a kept parser
    if (command, action) not in _RESUMED_LATER:
        collector.resume()
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
