"""``runner fetch`` (a contract's assets into the cache) and ``runner cache ls|prune|verify``
(the asset cache and the input cache)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.cli._common import (
    EXIT_JOB_FAILED,
    EXIT_SUCCEEDED,
    HOST_HELP,
    HumanProgress,
    host_options,
    load_host,
    usage,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from runner.cli._common import Subparsers
    from runner.execution import agentimage

__all__ = ["register"]

_STATE_HELP = "the state folder (default: $RUNNER_STATE_DIR, else the user's state dir)"


def register(sub: Subparsers, name: str, help: str) -> None:
    if name == "fetch":
        p = sub.add_parser(
            name,
            help=help,
            description="Fetch every asset the contract lists into this host's asset cache "
            "(<state>/cache/assets), on the host, never in a job: from the sources in order "
            "(http(s) hosts the host policy's assets.allowHosts names, or files beside the "
            "contract), resuming an interrupted download with an HTTP range, retrying 5xx "
            "answers and timeouts, giving up at once on a 4xx. Nothing is cached until its "
            "SHA-256 and size are the contract's. Two runners fetching one asset download it "
            "once. The contract is checked as `runner run` checks it (signature, expiry, "
            "policy).",
            epilog=HOST_HELP + "\nexamples:\n"
            "  runner fetch task.json                     # progress bars on stderr\n"
            "  runner fetch task.dsse.json --json         # one JSON report on stdout\n",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("contract", metavar="CONTRACT", help="task.json or a DSSE envelope")
        host_options(p)
        p.add_argument("--state-dir", metavar="DIR", help=_STATE_HELP)
        p.add_argument("--json", action="store_true", help="a JSON report, no progress bars")
        p.set_defaults(func=cmd_fetch)
        return
    cache = sub.add_parser(
        name,
        help=help,
        description="The asset cache (<state>/cache/assets) and the input cache "
        "(<state>/cache/inputs: papers, repositories and prompts, kept by digest and "
        "hard-linked into the next job's input/): what they hold, making room, checking them. "
        "An entry a job that has not ended uses (its record/assets.json or record/inputs.json "
        "names it and its ledger has no job.finished) is never removed.",
    )
    actions = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    register(actions, "fetch", "fetch a contract's assets into this host's cache, verified")
    ls = actions.add_parser(
        "ls", help="list the cached assets and inputs: digest, size, ids, last use, users"
    )
    ls.add_argument("--state-dir", metavar="DIR", help=_STATE_HELP)
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_cache_ls)
    prune = actions.add_parser(
        "prune",
        help="remove cached assets and inputs no running job uses, least recently used first",
        description="Remove cached assets and inputs that no job that has not ended uses, "
        "least recently used first (one order over both caches). With --older-than, only "
        "those unused that long; with --max-bytes, only until the caches hold at most that; "
        "with neither, every entry not in use. An input's bytes are freed once no job folder "
        "links them either (a finished job keeps its input/ for a re-grade). Cached agent "
        "runtimes (extracted from adapter images) are pruned with --older-than or with "
        "neither flag, never while a container (any state) mounts them; --max-bytes alone "
        "leaves them.",
        epilog="examples:\n"
        "  runner cache prune --max-bytes 50G          # down to 50 GiB\n"
        "  runner cache prune --older-than 14d         # unused for two weeks\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prune.add_argument("--max-bytes", metavar="N", help="keep at most N bytes (1000, 512M, 2G)")
    prune.add_argument("--older-than", metavar="D", help="only assets unused for D (90s, 12h, 7d)")
    prune.add_argument("--state-dir", metavar="DIR", help=_STATE_HELP)
    prune.add_argument("--json", action="store_true")
    prune.set_defaults(func=cmd_cache_prune)
    verify = actions.add_parser(
        "verify",
        help="re-hash every cached input and agent runtime; remove those not as cached",
        description="Re-hash every file of every input cache entry against the digest it was\n"
        "cached under, and every agent runtime's files against its runtime.json. Before\n"
        "linking a cached file (or mounting a runtime), a job checks only its inode, size,\n"
        "modification time and read-only mode (cheap); this also catches an edit that kept\n"
        "those. An entry that fails is removed (--keep: only listed); the next job that\n"
        "needs it stages that input from its source (extracts that runtime again). Exit\n"
        "status 1 when any entry failed.",
        epilog="examples:\n  runner cache verify --json\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verify.add_argument("--keep", action="store_true", help="list bad entries, remove none")
    verify.add_argument("--state-dir", metavar="DIR", help=_STATE_HELP)
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(func=cmd_cache_verify)


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{n:,} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def cmd_fetch(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from runner.app import host
    from runner.caches.assets import AssetCache, fetch
    from runner.contract import load_contract
    from runner.planning import policy

    loaded, trust = load_host(args)
    contract = load_contract(Path(args.contract), trust)
    policy.check(contract, loaded.policy, datetime.now(UTC))
    cache = AssetCache.of_state(host.state_dir(args.state_dir))
    wanted = contract.model.fetched_assets
    report: list[dict[str, Any]] = []
    shown = None if args.json else HumanProgress()  # --json: stdout carries the report only
    for a in wanted:

        def progress(_asset: Any, have: int, total: int, label: str = f"fetching {a.id}") -> None:
            if shown is not None:
                shown.transfer(label, have, total)

        try:
            got = fetch(a, contract.base_dir, cache, loaded.policy.assets, on_bytes=progress)
        finally:
            if shown is not None:
                shown.done()
        report.append(got.as_json())
        if not args.json:
            how = (
                "cached already"
                if got.cached
                else f"fetched {_size(got.downloaded)} in {got.seconds:.1f} s"
            )
            print(f"{a.id}  {a.sha256[:19]}…  {_size(a.size)}  -> /job/assets/{a.path}  ({how})")
    if args.json:
        print(json.dumps({"contract": contract.digest, "cache": str(cache.root),
                          "assets": report}, indent=2))  # fmt: skip
    elif not wanted:
        print("the contract lists no asset to fetch")
    return EXIT_SUCCEEDED


def _cache(args: argparse.Namespace) -> tuple[Any, Any]:
    from runner.app import host
    from runner.caches.assets import AssetCache
    from runner.state.jobdir import StateDir

    state = StateDir(host.state_dir(args.state_dir))
    return AssetCache.of_state(state.root), state


def _inputs(args: argparse.Namespace) -> Any:
    from runner.app import host
    from runner.caches.inputcache import InputCache

    return InputCache.of_state(host.state_dir(args.state_dir))


def cmd_cache_ls(args: argparse.Namespace) -> int:
    from runner.caches.assetcache import entries

    cache, state = _cache(args)
    found = entries(cache, state, _inputs(args))
    total = sum(e.bytes for e in found)
    if args.json:
        print(json.dumps({"entries": [e.as_json() for e in found], "totalBytes": total},
                         indent=2))  # fmt: skip
        return EXIT_SUCCEEDED
    for e in found:
        d = e.as_json()
        users = ", ".join(e.users) or "-"
        print(f"sha256:{e.sha256[:12]}…  {_size(e.bytes):>10}  {','.join(e.kinds):<14} "
              f"{','.join(e.ids) or '-':<20} last used {d['lastUsedAt'] or '-'}  "
              f"in use by {users}")  # fmt: skip
    n_inputs = sum(1 for e in found if e.cache == "input")
    print(f"{len(found) - n_inputs} asset(s) and {n_inputs} input(s), {_size(total)} in "
          f"{cache.root.parent}")  # fmt: skip
    return EXIT_SUCCEEDED


def cmd_cache_prune(args: argparse.Namespace) -> int:
    from runner.caches.assetcache import prune
    from runner.core.units import parse_bytes, parse_seconds

    try:
        max_bytes = parse_bytes(args.max_bytes) if args.max_bytes is not None else None
        older = parse_seconds(args.older_than) if args.older_than is not None else None
    except ValueError as exc:
        usage(str(exc))
    cache, state = _cache(args)
    done = prune(cache, state, max_bytes=max_bytes, older_than=older, inputs=_inputs(args))
    runtimes = None
    if older is not None or max_bytes is None:
        from runner.execution import agentimage

        runtimes = agentimage.prune(state.root, older_than=older, in_use=_runtime_users())
    if args.json:
        print(json.dumps({**done.as_json(), "agentRuntimes": _pruned_json(runtimes)}, indent=2))
        return EXIT_SUCCEEDED
    for name in runtimes.removed if runtimes else []:
        print(f"removed agent runtime {name[:12]}…")
    for name, holders in (runtimes.kept_in_use if runtimes else {}).items():
        print(f"kept    agent runtime {name[:12]}…  mounted in {', '.join(holders)}")
    for e in done.removed:
        print(f"removed sha256:{e.sha256[:12]}…  {_size(e.bytes)}  {','.join(e.ids)}")
    for e in done.kept_in_use:
        print(f"kept    sha256:{e.sha256[:12]}…  in use by {', '.join(e.users)}")
    for e in done.kept_busy:
        print(f"kept    sha256:{e.sha256[:12]}…  another runner is fetching or staging it")
    freed = sum(e.bytes for e in done.removed) + (runtimes.freed_bytes if runtimes else 0)
    print(f"freed {_size(freed)}; the cache holds {_size(done.left_bytes)}")
    return EXIT_SUCCEEDED


def _runtime_users() -> Callable[[str], list[str]]:
    """Which containers mount a cached agent runtime, asked of the engine (one that cannot
    be reached fails the command: nothing is removed unasked)."""
    from runner import backends
    from runner.execution import agentimage

    backend = backends.default()
    return lambda name: agentimage.users(backend, name)


def _pruned_json(runtimes: agentimage.Pruned | None) -> dict[str, Any] | None:
    if runtimes is None:
        return None
    return {
        "removed": runtimes.removed,
        "keptInUse": runtimes.kept_in_use,
        "freedBytes": runtimes.freed_bytes,
    }


def cmd_cache_verify(args: argparse.Namespace) -> int:
    from runner.app import host
    from runner.caches.inputcache import verify
    from runner.execution import agentimage

    inputs = _inputs(args)
    checked = len(inputs.hexes())
    bad = verify(inputs, remove=not args.keep)
    runtimes, bad_runtimes = agentimage.verify(
        host.state_dir(args.state_dir),
        remove=not args.keep,
        in_use=None if args.keep else _runtime_users(),
    )
    if args.json:
        print(json.dumps({"checked": checked, "removed": not args.keep and bool(bad),
                          "bad": [{"sha256": f"sha256:{h}", "problem": p}
                                  for h, p in bad.items()],
                          "agentRuntimes": {"checked": runtimes,
                                            "bad": [{"entry": e, "problem": p}
                                                    for e, p in bad_runtimes.items()]}},
                         indent=2))  # fmt: skip
    else:
        how = "kept" if args.keep else "removed"
        for hexd, problem in bad.items():
            print(f"{how} sha256:{hexd[:12]}…  {problem}")
        for entry, problem in bad_runtimes.items():
            print(f"{how} agent runtime {entry[:12]}…  {problem}")
        print(f"{checked} input cache entries checked, {len(bad)} not as cached")
        print(f"{runtimes} agent runtime(s) checked, {len(bad_runtimes)} not as extracted")
    return EXIT_JOB_FAILED if bad or bad_runtimes else EXIT_SUCCEEDED
