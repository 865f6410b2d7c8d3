"""What the asset cache and the input cache hold (``runner cache ls``) and making room
(``runner cache prune``).

An entry is one digest: its bytes, the trees they unpack to, a partial download, its meta.
It is *in use* while a job whose record names it (``record/assets.json``, written before the
job looks at the cache) has not ended: its ledger has no ``job.finished`` event (a job folder
without a readable ledger counts as not ended). Prune never removes an entry in use, nor one
whose lock another runner holds (a fetch in progress); it takes the digest's lock before it
looks at the jobs, and a job checks the cache under that same lock after writing its record,
so a job either is seen as a user or finds the entry gone (and fetches it, or says so).

The input cache (:mod:`runner.caches.inputcache`) is listed and pruned the same way, one LRU order
over both: its entries are in use while a job's ``record/inputs.json`` names them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from runner.caches import inputcache
from runner.caches.assets import AssetCache, used_by
from runner.caches.inputcache import InputCache
from runner.core import archives
from runner.state.jobdir import JobDir, StateDir
from runner.state.ledger import LedgerCorrupt, read_state

__all__ = ["entries", "in_use", "prune"]

_HEX = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class Entry:
    """One digest in the cache."""

    sha256: str
    bytes: int = 0
    kinds: list[str] = field(default_factory=list)
    """``file``, ``tree:tar``, ``tree:zip``, ``partial``."""
    ids: list[str] = field(default_factory=list)
    fetched_at: str | None = None
    last_used: float = 0.0
    """Seconds since the epoch: the meta's lastUsedAt, else the newest file time."""
    users: list[str] = field(default_factory=list)
    """Job ids that have not ended and use it."""
    cache: str = "asset"
    """``asset``, or ``input`` (an input cache entry; ``ids`` are the paths it was staged as)."""

    def as_json(self) -> dict[str, Any]:
        return {
            "cache": self.cache,
            "sha256": f"sha256:{self.sha256}",
            "bytes": self.bytes,
            "kinds": self.kinds,
            "ids": self.ids,
            "fetchedAt": self.fetched_at,
            "lastUsedAt": datetime.fromtimestamp(self.last_used)
            .astimezone()
            .isoformat(timespec="seconds")
            if self.last_used
            else None,
            "inUseBy": self.users,
        }


def entries(
    cache: AssetCache, state: StateDir | None = None, inputs: InputCache | None = None
) -> list[Entry]:
    """Every digest in the cache (and in ``inputs``), with its users when ``state`` is given;
    least recently used first."""
    found: dict[str, Entry] = {}

    def entry(hexd: str) -> Entry:
        return found.setdefault(hexd, Entry(hexd))

    def seen(e: Entry, path: Path) -> None:
        e.last_used = max(e.last_used, os.lstat(path).st_mtime)

    for sub, kind in (("sha256", "file"), ("partial", "partial"), ("trees", "tree")):
        folder = cache.root / sub
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            name = path.name
            if kind == "partial":
                name = name.removesuffix(".partial")
            elif kind == "tree":
                name, _, sort = name.partition(".")
            if not _HEX.match(name):
                continue  # a temporary folder of an unpack in progress, or not ours
            e = entry(name)
            if kind == "tree":
                e.kinds.append(f"tree:{sort}")
                e.bytes += archives.tree_bytes(path)
            else:
                e.kinds.append(kind)
                e.bytes += os.lstat(path).st_size
            seen(e, path)
    for hexd, e in found.items():
        try:
            meta = json.loads(cache.meta(hexd).read_bytes())
        except (OSError, ValueError):
            continue
        e.ids = [str(i) for i in meta.get("ids", [])]
        e.fetched_at = meta.get("fetchedAt")
        with contextlib.suppress(ValueError, KeyError, TypeError):
            e.last_used = max(e.last_used, datetime.fromisoformat(meta["lastUsedAt"]).timestamp())
    if state is not None:
        using = in_use(state)
        for hexd, e in found.items():
            e.users = sorted(using.get(hexd, []))
    every = list(found.values())
    if inputs is not None:
        every.extend(input_entries(inputs, state))
    return sorted(every, key=lambda e: e.last_used)


def input_entries(inputs: InputCache, state: StateDir | None = None) -> list[Entry]:
    """Every entry of the input cache, with its users when ``state`` is given."""
    using = in_use(state, inputcache.used_by) if state is not None else {}
    out = []
    for hexd in inputs.hexes():
        e = Entry(hexd, cache="input")
        m = inputs.read_manifest(hexd)
        e.kinds = [f"input:{m['kind']}" if m else "input:broken"]
        e.bytes = int(m.get("bytes", 0)) if m else 0
        with contextlib.suppress(OSError):
            e.last_used = os.lstat(inputs.entry(hexd)).st_mtime
        try:
            meta = json.loads(inputs.meta(hexd).read_bytes())
            e.ids = [str(p) for p in meta.get("paths", [])]
            e.fetched_at = meta.get("madeAt")
            e.last_used = max(e.last_used, datetime.fromisoformat(meta["lastUsedAt"]).timestamp())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
        e.users = sorted(using.get(hexd, []))
        out.append(e)
    return out


def in_use(state: StateDir, used: Callable[[JobDir], list[str]] = used_by) -> dict[str, list[str]]:
    """Digest (hex) -> ids of the jobs that use it and have not ended: assets, or with
    ``used`` = :func:`runner.caches.inputcache.used_by`, inputs."""
    using: dict[str, list[str]] = {}
    if not state.jobs.is_dir():
        return using
    for root in state.jobs.iterdir():
        job = state.job(root.name)
        digests = used(job)
        if not digests or _ended(job.ledger):
            continue
        for hexd in digests:
            using.setdefault(hexd, []).append(root.name)
    return using


def _ended(ledger: Path) -> bool:
    try:
        return read_state(ledger).finished is not None
    except (OSError, LedgerCorrupt, ValueError):
        return False  # unreadable: it may not have ended; keep what it uses


@dataclass(frozen=True)
class Pruned:
    removed: list[Entry]
    kept_in_use: list[Entry]
    kept_busy: list[Entry]
    """Entries another runner was fetching (their lock held)."""
    left_bytes: int

    def as_json(self) -> dict[str, Any]:
        return {
            "removed": [e.as_json() for e in self.removed],
            "removedBytes": sum(e.bytes for e in self.removed),
            "keptInUse": [e.as_json() for e in self.kept_in_use],
            "keptBusy": [e.as_json() for e in self.kept_busy],
            "leftBytes": self.left_bytes,
        }


def prune(
    cache: AssetCache,
    state: StateDir,
    *,
    max_bytes: int | None = None,
    older_than: float | None = None,
    now: float | None = None,
    inputs: InputCache | None = None,
) -> Pruned:
    """Remove entries no job that has not ended uses, least recently used first: those not used
    for ``older_than`` seconds, and (with ``max_bytes``) only until the caches hold at most that.
    With neither, every entry not in use goes. ``inputs``: the input cache's entries too."""
    now = time.time() if now is None else now
    everything = entries(cache, state, inputs)
    total = sum(e.bytes for e in everything)
    removed: list[Entry] = []
    in_use_kept: list[Entry] = []
    busy: list[Entry] = []
    for e in everything:  # least recently used first
        if max_bytes is not None and total <= max_bytes:
            break
        if older_than is not None and e.last_used > now - older_than:
            continue
        of_inputs = e.cache == "input" and inputs is not None
        lock = inputs.locked if of_inputs and inputs is not None else cache.locked
        with lock(e.sha256, wait=False) as got:
            if not got:
                busy.append(e)
                continue
            used = inputcache.used_by if of_inputs else used_by
            users = in_use(state, used).get(e.sha256, [])  # again, under the lock
            if users:
                e.users = sorted(users)
                in_use_kept.append(e)
                continue
            if of_inputs and inputs is not None:
                inputs.remove(e.sha256)
            else:
                _remove(cache, e.sha256)
        removed.append(e)
        total -= e.bytes
    _remove_stale(cache)
    if inputs is not None:
        inputs.remove_debris()
    return Pruned(removed, in_use_kept, busy, total)


def _remove_stale(cache: AssetCache) -> None:
    """Remove what unpacks that did not finish left in trees/ (``.<hex>.<kind>.<pid>.tmp``),
    each under its digest's lock (not while another runner unpacks it)."""
    trees = cache.root / "trees"
    if not trees.is_dir():
        return
    for hexd in sorted({p.name[1:65] for p in trees.glob(".*.tmp")}):
        if not _HEX.match(hexd):
            continue
        with cache.locked(hexd, wait=False) as got:
            if got:
                archives.remove_stale(trees, hexd)


def _remove(cache: AssetCache, hexd: str) -> None:
    for tree in (cache.root / "trees").glob(f"{hexd}.*"):
        archives.remove_tree(tree)
    archives.remove_stale(cache.root / "trees", hexd)
    partial = cache.partial(hexd)
    source = partial.with_name(partial.name + ".source")  # see download.Download.sidecar
    for path in (cache.blob(hexd), partial, source, cache.meta(hexd)):
        path.unlink(missing_ok=True)
