"""The input and asset caches: a second job's staging against its first's."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks._support import (
    GIB,
    INPROC,
    MIB,
    Bench,
    Row,
    big_file,
    fmt,
    make_inputs,
    ratio_rows,
    size_text,
    summary,
)
from runner.testing import IMAGE, write_contract


def fig_stagecache(b: Bench, reps: int, size: int) -> Row:
    """A job's whole staging (inputs, assets, working copy) twice on one new state folder: the
    second job's (everything cached) against the first's (copy and hash of every input, fetch
    of the asset from beside the contract), measured in the same process, each pair fresh."""
    from runner.app import issuer

    base = b.s.tmp / "stagecache"
    base.mkdir(parents=True)
    half = (size // 2 // MIB) * MIB
    big_file(base / "paper.bin", half)
    asset_hex = big_file(base / "checkpoint.bin", half)

    def change(data: dict[str, Any]) -> None:
        data["paper"]["path"] = "paper.bin"
        data["assets"] = [{"id": "checkpoint", "sources": ["checkpoint.bin"], "size": half,
                           "sha256": f"sha256:{asset_hex}", "path": "checkpoint.bin"}]  # fmt: skip

    contract = write_contract(base, IMAGE, change=change)
    (base / "paper.md").unlink()
    issuer.pin(contract)  # binds the inputs' digests: what lets the second job skip the source
    firsts: list[dict[str, Any]] = []
    seconds: list[dict[str, Any]] = []
    rss: list[int] = []

    def pair(contract: Path = contract) -> dict[str, Any]:
        state = base / "state" / b.job_id("stagecache")
        out = subprocess.run(
            [sys.executable, str(INPROC), "stagecache", str(contract), str(state)],
            env=b.s.env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        shutil.rmtree(state)
        result: dict[str, Any] = json.loads(out.stdout)
        if result["second"]["copied"] or len(result["second"]["linked"]) != 2:
            raise RuntimeError(f"the second job did not stage from the cache: {result}")
        rss.append(int(result["peakRssBytes"]))
        return result

    pair()  # warm-up: the sources in the page cache for every first job from here on
    for _ in range(reps):
        result = pair()
        firsts.append(result["first"])
        seconds.append(result["second"])
    # The same with a large repository (a quarter of the size, many small files): what the
    # working copy, a full copy per job, costs the second job.
    big = base / "bigrepo"
    big.mkdir()
    shutil.copy(contract, big / "task.json")
    os.link(base / "paper.bin", big / "paper.bin")
    os.link(base / "checkpoint.bin", big / "checkpoint.bin")
    repo_files, repo_bytes = make_inputs(big / "repository", size // 4)
    issuer.pin(big / "task.json")
    pair(big / "task.json")  # warm-up
    with_big = pair(big / "task.json")
    xs = [r["seconds"] for r in seconds]
    ys = [r["seconds"] for r in firsts]
    ratio = statistics.median(xs) / statistics.median(ys)
    parts = {
        key: statistics.median(r[key] for r in seconds)
        for key in ("inputsSeconds", "assetsSeconds", "workingCopySeconds")
    }
    first_parts = {
        key: statistics.median(r[key] for r in firsts)
        for key in ("inputsSeconds", "assetsSeconds", "workingCopySeconds")
    }
    row = Row(
        f"staging a second job whose {size_text(2 * half)} of inputs and assets are cached",
        "stagecache",
        "s",
        "the same job's first staging (same run, fresh state folder): inputs copied and hashed, "
        "the asset fetched from beside the contract",
        summary(ys),
        summary(xs),
        ratio,
        paired=ratio_rows(xs, ys),
        extra={
            "bytes": 2 * half,
            "secondParts": parts,
            "firstParts": first_parts,
            "peakRssBytes": max(rss),
            "largeRepository": {"files": repo_files, "bytes": repo_bytes, **with_big},
        },
    )
    row.notes.append(
        f"each: a {size_text(half)} paper and a {size_text(half)} asset (a file beside the "
        "contract) and the toy repository, the contract pinned (`runner pin`: the inputs' "
        "digests bound); `benchmarks/inproc.py stagecache` times `stage_inputs` through "
        "the input cache, `assets.stage` (fetchOnRun) and `layout.working_copy` in one process"
    )
    row.notes.append(
        "second job, medians: inputs (hard links from the input cache) "
        f"{fmt(parts['inputsSeconds'], 's')}, assets (found in the cache) "
        f"{fmt(parts['assetsSeconds'], 's')}, working copy of the repository "
        f"{fmt(parts['workingCopySeconds'], 's')}; first job: inputs "
        f"{fmt(first_parts['inputsSeconds'], 's')}, assets "
        f"{fmt(first_parts['assetsSeconds'], 's')}, working copy "
        f"{fmt(first_parts['workingCopySeconds'], 's')}"
    )
    w1, w2 = with_big["first"], with_big["second"]
    row.notes.append(
        "the working copy (workspace/repository, writable) is still a full copy per job: with a "
        f"{size_text(repo_bytes)} repository ({repo_files:,} files) instead of the toy's, once, "
        f"the second job's staging took {fmt(w2['seconds'], 's')} (ratio "
        f"{w2['seconds'] / w1['seconds']:.2f} to the first's {fmt(w1['seconds'], 's')}), of "
        f"which the working copy {fmt(w2['workingCopySeconds'], 's')} and the linked inputs "
        f"{fmt(w2['inputsSeconds'], 's')}: with a large repository the working copy, not the "
        "cache, sets the second job's staging time"
    )
    if 2 * half < 2 * GIB:
        row.notes.append(f"scaled down from 2 GiB to {size_text(2 * half)} (`--stagecache-gb`)")
    return row
