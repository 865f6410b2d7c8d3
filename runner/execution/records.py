"""What the runner keeps of each attempt, under ``record/attempts/<n>/``.

Each attempt has its own record folder: the container's final state and the engine's log of
it (written by :mod:`runner.execution.container`), the manifest of what ``output/`` held when the
attempt ended, and — once a later attempt starts — the attempt's stdout and stderr, moved
there by rename so that nothing an attempt wrote is ever truncated or replaced. The envelope
says which attempt wrote each evidence file by matching a file's size and mtime against these
manifests.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.core import safefs
from runner.execution import resources
from runner.models.envelope import AttemptRecord, RecordFile
from runner.staging.jobdir import sha256_under
from runner.state.jobdir import JobDir, write_json
from runner.state.ledger import LedgerState

__all__ = ["attempt_records", "output_manifest", "rotate_streams", "writers"]


def rotate_streams(job: JobDir, previous: int, stream_paths: list[str]) -> list[str]:
    """Before a new attempt writes its stdout and stderr, move the ones attempt ``previous``
    left to ``record/attempts/<previous>/streams/`` (renamed, never copied or truncated, and
    never through a link the job planted in ``output/``). Returns what was moved."""
    moved = []
    dest_root = job.attempt_record(previous) / "streams"
    for rel in stream_paths:
        try:
            with safefs.parent_fd(job.output, rel) as (fd, name):
                try:
                    os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                dest = dest_root / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.rename(name, dest, src_dir_fd=fd)
                moved.append(rel)
        except safefs.UnsafePath:
            continue  # the job made the folder a link or removed it: nothing of ours is there
    return moved


MAX_MANIFEST_ENTRIES = 100_000
MAX_MANIFEST_DEPTH = 256
"""Folders below this depth are not listed (the manifest says ``truncated``); the disk quota
stops a job whose folders nest deeper (runner.execution.quotas.MAX_DEPTH)."""


def output_manifest(job: JobDir, n: int) -> dict[str, Any]:
    """What ``output/`` held when attempt ``n`` ended (path, kind, size, mtime; no link
    followed, no file read), kept as ``record/attempts/<n>/output-manifest.json``: which
    attempt wrote each evidence file is read from these. Walked without recursion
    (:func:`runner.core.safefs.walk`): a job's tree a thousand deep raised RecursionError here,
    which took the run's measurements with it."""
    entries: list[dict[str, Any]] = []
    full = too_deep = False
    walked = safefs.walk(job.output, max_depth=MAX_MANIFEST_DEPTH)
    for dirpath, depth, dirnames, filenames in walked:
        dirnames.sort()
        too_deep = too_deep or (depth == MAX_MANIFEST_DEPTH and bool(dirnames))
        for name in sorted(filenames):  # files, and links (to folders too), as they are
            if len(entries) >= MAX_MANIFEST_ENTRIES:
                full = True
                break
            path = Path(dirpath, name)
            try:
                st = path.lstat()
            except OSError:
                continue
            entries.append(
                {
                    "path": str(path.relative_to(job.output)),
                    "kind": "file" if stat.S_ISREG(st.st_mode) else safefs.kind(st.st_mode),
                    "size": st.st_size,
                    "mtimeNs": st.st_mtime_ns,
                }
            )
        if full:
            break
    manifest = {
        "schemaVersion": "1.0",
        "attempt": n,
        "truncated": full or too_deep,
        "files": entries,
    }
    folder = job.attempt_record(n)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "output-manifest.json", manifest)
    return manifest


def writers(job: JobDir, attempts: int) -> Callable[[str], int | None]:
    """For a path under ``output/``: the attempt that wrote it as it is now, i.e. the first
    whose end found it with its present size and mtime; None when none did (or it is gone)."""
    seen: list[dict[str, tuple[int, int]]] = []
    for n in range(1, attempts + 1):
        try:
            files = json.loads((job.attempt_record(n) / "output-manifest.json").read_bytes())
            seen.append({f["path"]: (f["size"], f["mtimeNs"]) for f in files["files"]})
        except (OSError, ValueError, KeyError, TypeError):
            seen.append({})

    def of(rel: str) -> int | None:
        try:
            st = safefs.lstat_under(job.output, rel)
        except safefs.UnsafePath:
            return None
        now = (st.st_size, st.st_mtime_ns)
        return next((n for n, files in enumerate(seen, 1) if files.get(rel) == now), None)

    return of


def attempt_files(job: JobDir, n: int, max_bytes: int) -> list[tuple[str, str | None, int]]:
    """``(path relative to the job folder, "sha256:<hex>" or None past max_bytes, size)`` of
    every regular file kept in ``record/attempts/<n>/``; no link followed."""
    out: list[tuple[str, str | None, int]] = []
    for dirpath, dirnames, filenames in os.walk(job.attempt_record(n)):
        dirnames.sort()
        for name in sorted(filenames):
            rel = str(Path(dirpath, name).relative_to(job.root))
            try:
                sha, size = sha256_under(job.root, rel, max_bytes)
            except (safefs.UnsafePath, OSError):
                continue
            out.append((rel, f"sha256:{sha}" if sha else None, size))
    return out


def attempt_records(state: LedgerState, job: JobDir, max_bytes: int) -> list[AttemptRecord]:
    """Every attempt in the ledger, with how it ended and the hashed files kept of it."""
    out = []
    for a in state.attempts:
        fin = a.finished or {}
        files = [
            RecordFile(path=rel, sha256=sha, size=size)
            for rel, sha, size in attempt_files(job, a.number, max_bytes)
        ]
        out.append(
            AttemptRecord(
                attempt=a.number,
                classification=fin.get("classification"),
                seconds=round(a.seconds, 3),
                how=fin.get("how"),
                host=(a.starting.get("host") or {}).get("name"),
                files=files,
                resources=resources.read_figures(job, a.number),
            )
        )
    return out
