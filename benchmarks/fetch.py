"""Fetching an asset from a loopback server against `curl -o` of the same file followed by
`sha256sum` of it (a user's own way of fetching and checking it)."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
from typing import Any

from benchmarks._support import (
    GIB,
    INPROC,
    MIB,
    ROOT,
    Bench,
    Row,
    X,
    big_file,
    interleave,
    ratio_rows,
    size_text,
    summary,
    timed_command,
)
from runner.testing import IMAGE, write_contract


def fig_fetch(b: Bench, reps: int, size: int) -> Row:
    """`runner.caches.assets.fetch` of one asset from a loopback server (scripts/serve_assets.py)
    against `curl -o` of the same file from the same server then `sha256sum` of it, timed
    together, interleaved; `curl -o` alone is reported beside it (the first part of each)."""
    base = b.s.tmp / "fetch"
    served = base / "served"
    served.mkdir(parents=True)
    blob_hex = big_file(served / "blob.bin", size)
    nbytes = (size // MIB) * MIB
    server = b.s.spawn(
        [sys.executable, str(ROOT / "scripts" / "serve_assets.py"), str(served), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    first = server.stdout.readline().decode() if server.stdout is not None else ""
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", first)
    if match is None:
        raise RuntimeError(f"serve_assets.py did not say its port: {first!r}")
    url = f"http://127.0.0.1:{match.group(1)}/blob.bin"

    def change(data: dict[str, Any]) -> None:
        data["assets"] = [{"id": "blob", "sources": [url], "size": nbytes, "path": "blob.bin",
                           "sha256": f"sha256:{blob_hex}"}]  # fmt: skip

    contract = write_contract(base, IMAGE, with_inputs=False, change=change)
    rss: list[int] = []

    def runner() -> float:
        state = base / "state" / b.job_id("fetch")
        out = subprocess.run(
            [sys.executable, str(INPROC), "fetch", str(contract), str(state)],
            env=b.s.env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        shutil.rmtree(state)
        result: dict[str, Any] = json.loads(out.stdout)
        if result["bytes"] != nbytes:
            raise RuntimeError(f"fetched {result['bytes']} bytes, not {nbytes}")
        rss.append(int(result["peakRssBytes"]))
        return float(result["seconds"])

    curl_alone: list[float] = []

    def baseline() -> float:
        dest = base / b.job_id("curl")
        seconds = timed_command(b, ["curl", "-sf", "-o", str(dest), url])
        curl_alone.append(seconds)
        seconds += timed_command(b, ["sha256sum", str(dest)])
        dest.unlink()
        return seconds

    try:
        runner()
        baseline()  # warm-up: the served file in the page cache for both
        del curl_alone[:], rss[:]
        xs, ys = interleave(reps, runner, baseline)
    finally:
        server.terminate()
        server.wait()
        with b.s.lock:
            b.s.children.discard(server)
    ratio = statistics.median(xs) / statistics.median(ys)
    peak = max(rss)
    met = ratio <= 1 / 0.9 and peak <= 100 * 1000**2
    row = Row(
        f"fetching a {size_text(nbytes)} asset from a loopback server",
        "fetch",
        "s",
        "`curl -o` of the same file from the same server, then `sha256sum` of it",
        summary(ys),
        summary(xs),
        ratio,
        f"≤ 1.11{X} (throughput ≥ 0.9{X}), RSS ≤ 100 MB",
        met,
        ratio_rows(xs, ys),
        extra={
            "bytes": nbytes,
            "runnerPeakRssBytes": peak,
            "curlAlone": summary(curl_alone),
            "ratioToCurlAlone": statistics.median(xs) / statistics.median(curl_alone),
        },
    )
    row.notes.append(
        "runner: `runner.caches.assets.fetch` timed in-process (a fresh cache each time): download "
        f"with requests, SHA-256 as the bytes arrive, fsync, rename; peak RSS {peak / MIB:.0f} MiB "
        "(the whole interpreter)"
    )
    row.notes.append(
        "both read from scripts/serve_assets.py (Python's http.server): at loopback speeds the "
        "server is the ceiling of both, so the ratio says the runner adds little on top of it"
    )
    alone = statistics.median(curl_alone)
    row.notes.append(
        f"`curl -o` alone (the first part of each baseline): {alone:.3f} s median; the runner "
        f"{statistics.median(xs) / alone:.2f}{X} its time"
    )
    if size < GIB:
        row.notes.append(f"scaled down from 1 GiB to {size_text(nbytes)} (`--fetch-gb`)")
    return row
