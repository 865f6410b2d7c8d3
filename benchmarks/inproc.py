#!/usr/bin/env python3
"""In-process measurements for the benchmark (scripts/benchmark.py), each in its own
interpreter so that its peak RSS is its own.

    inproc.py stage CONTRACT JOB_DIR   time runner.staging.jobdir.stage_inputs
    inproc.py parse LOG PATTERN         time regex.scalar (occurrence last) on LOG
    inproc.py fetch CONTRACT STATE_DIR  time runner.caches.assets.fetch of the contract's
    first
                                              asset (from a loopback server) into a new cache
    inproc.py stagecache CONTRACT STATE_DIR
                                              time a job's whole staging (inputs through the
                                              input cache, assets, working copy) twice on one
                                              new state folder: the first job, then the second

Prints one JSON object: the seconds of the call alone (imports excluded), the process's peak
RSS (``ru_maxrss``) and its RSS just before the call.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Any


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize()


def _peak_rss() -> int:
    """This process's peak RSS since it started: VmHWM, not getrusage's ru_maxrss, which Linux
    carries over from before execve (the forked copy of the benchmark that started it)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def stage(contract_path: Path, job_root: Path) -> dict[str, Any]:
    from runner.contract import load_contract
    from runner.parsers import registry  # imported by stage_inputs; keep it out of the timing
    from runner.staging import jobdir as staging

    registry.catalog()
    contract = load_contract(contract_path)
    job = staging.prepare(job_root)
    before = _rss_now()
    t0 = time.perf_counter()
    files = staging.stage_inputs(job, contract)
    seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "files": len(files),
        "bytes": sum(f.size for f in files),
        "rssBeforeBytes": before,
        "peakRssBytes": _peak_rss(),
    }


def parse(log: Path, pattern: str) -> dict[str, Any]:
    from runner.parsers import registry

    parser = registry.get("regex.scalar", "1")
    config = {"pattern": pattern, "occurrence": "last", "type": "number"}
    before = _rss_now()
    t0 = time.perf_counter()
    value = parser.parse(log, config)
    seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "value": value,
        "rssBeforeBytes": before,
        "peakRssBytes": _peak_rss(),
    }


def fetch(contract_path: Path, state: Path) -> dict[str, Any]:
    import requests  # noqa: F401 - imported by the fetch; kept out of the timing
    import tenacity  # noqa: F401

    from runner.caches.assets import AssetCache, fetch
    from runner.contract import load_contract
    from runner.planning.policy import AssetGrant

    contract = load_contract(contract_path)
    asset = contract.model.fetched_assets[0]
    grant = AssetGrant(allowHosts=["127.0.0.1"])
    before = _rss_now()
    t0 = time.perf_counter()
    got = fetch(asset, contract.base_dir, AssetCache.of_state(state), grant)
    seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "bytes": got.downloaded,
        "rssBeforeBytes": before,
        "peakRssBytes": _peak_rss(),
    }


def stagecache(contract_path: Path, state_root: Path) -> dict[str, Any]:
    from runner.caches import assets, inputcache
    from runner.contract import load_contract
    from runner.execution import layout
    from runner.parsers import registry
    from runner.planning.policy import AssetGrant
    from runner.staging import jobdir as staging
    from runner.state.jobdir import StateDir

    registry.catalog()
    contract = load_contract(contract_path)
    state = StateDir(state_root)
    inputs = inputcache.InputCache.of_state(state.root)
    cache = assets.AssetCache.of_state(state.root)
    grant = AssetGrant(fetchOnRun=True)  # the asset is a file beside the contract
    out: dict[str, Any] = {}
    for n in ("first", "second"):
        job = staging.prepare(state.job(n).root)
        done = inputcache.Staged([], [], [])
        t0 = time.perf_counter()
        files = staging.stage_inputs(job, contract, via=inputcache.stager(inputs, job, done=done))
        t1 = time.perf_counter()
        mounts = assets.stage(job, contract, cache, grant)
        t2 = time.perf_counter()
        layout.working_copy(job, contract, 1 << 50)  # no quota: the copy alone is timed
        t3 = time.perf_counter()
        out[n] = {
            "seconds": t3 - t0,
            "inputsSeconds": t1 - t0,
            "assetsSeconds": t2 - t1,
            "workingCopySeconds": t3 - t2,
            "inputBytes": sum(f.size for f in files),
            "assets": len(mounts),
            "linked": done.linked,
            "copied": done.copied,
        }
    out["peakRssBytes"] = _peak_rss()
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in {"stage", "parse", "fetch", "stagecache"}:
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "stage":
        out = stage(Path(argv[1]), Path(argv[2]))
    elif argv[0] == "fetch":
        out = fetch(Path(argv[1]), Path(argv[2]))
    elif argv[0] == "stagecache":
        out = stagecache(Path(argv[1]), Path(argv[2]))
    else:
        out = parse(Path(argv[1]), argv[2])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
