"""Assets: datasets and checkpoints fetched once on the host, verified, shared read-only.

A contract's ``assets`` name each asset's sources, its SHA-256 and size, and where it appears
under ``/job/assets``. The runner keeps them in a content-addressed cache in its state folder::

    <state>/cache/assets/
        sha256/<hex>          the verified bytes (0444); only ever appears whole and checked
        trees/<hex>.<kind>/   an archive unpacked (tar, zip): files 0444, folders 0555
        partial/<hex>.partial a download in progress (resumed from here with an HTTP Range)
        partial/<hex>.partial.source  the SHA-256 of its source (resumed only from that one)
        locks/<hex>.lock      flock(2) per digest: one fetch at a time, prune waits for none
        meta/<hex>.json       ids and sources it was fetched for, when fetched, last used

Fetching (``runner fetch``, or ``runner run`` when the host policy's ``assets.fetchOnRun``
allows): under the digest's lock, each source in turn — an http(s) URL on a host the policy's
``assets.allowHosts`` names (redirects checked too), or a file beside the contract read without
following a link. Downloads are streamed with ``requests`` into the ``.partial`` file, resumed
with ``Range: bytes=N-`` after an interruption (a killed runner included), retried with
tenacity on 5xx answers, timeouts and broken connections, and given up at once on a 4xx. The
bytes are hashed as they arrive; only when their SHA-256 and size are the contract's is the file
renamed into ``sha256/`` (a wrong one is deleted: ``asset_digest_mismatch``, naming the asset
and both digests). A second runner asking for the same digest waits on the lock and then finds
it cached: one download.

A job's use: :func:`stage` writes the digests the job uses to ``record/assets.json`` (before
it looks at the cache, so ``runner cache prune`` never removes what a job that has not ended
uses; see :mod:`runner.caches.assetcache`), makes sure each is cached, and returns one read-only
bind
mount per asset at ``/job/assets/<path>`` (its mount point made in the job's ``assets/``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.backends.base import Mount
from runner.caches import store
from runner.caches.download import (
    Download,
    OnBytes,
    SourceFailed,
    Transient,
    WrongBytes,
    http,
    local,
    redacted,
    retrying,
)
from runner.caches.store import Store
from runner.contract import VerifiedContract
from runner.contract.models import Asset
from runner.core import archives, safefs
from runner.core.errors import AssetDigestMismatch, AssetUnavailable, PolicyViolation
from runner.planning.policy import AssetGrant
from runner.state.jobdir import JobDir, atomic_write, write_json

__all__ = ["AssetCache", "Fetched", "fetch", "stage", "used_by"]

RECORD = "assets.json"
STAGE_LOCK_WAIT = 2 * 3600.0
"""Seconds a job waits on another runner's fetch of one of its assets before it gives up
(``asset_unavailable``); ``runner fetch`` waits as long as it takes."""


def hex_of(asset: Asset) -> str:
    return asset.sha256.removeprefix("sha256:")


@dataclass(frozen=True)
class AssetCache(Store):
    """The content-addressed asset cache below the state folder."""

    NAME = "assets"
    FOLDERS = ("sha256", "trees", "partial", "meta", "locks")

    def blob(self, hexd: str) -> Path:
        return self.root / "sha256" / hexd

    def tree(self, hexd: str, kind: str) -> Path:
        return self.root / "trees" / f"{hexd}.{kind}"

    def partial(self, hexd: str) -> Path:
        return self.root / "partial" / f"{hexd}.partial"

    def mount_source(self, asset: Asset) -> Path:
        """What is mounted for the asset: its bytes, or the folder they unpack to."""
        hexd = hex_of(asset)
        return self.tree(hexd, asset.unpack) if asset.unpack else self.blob(hexd)

    def present(self, asset: Asset) -> bool:
        blob = self.blob(hex_of(asset))
        try:
            st = os.lstat(blob)
        except FileNotFoundError:
            return False
        if st.st_size != asset.size:
            return False
        return not asset.unpack or self.mount_source(asset).is_dir()

    def usage(self) -> int:
        """Bytes the cache holds: verified bytes, unpacked trees, partial downloads."""
        total = 0
        for sub in ("sha256", "partial"):
            total += archives.tree_bytes(self.root / sub) if (self.root / sub).is_dir() else 0
        trees = self.root / "trees"
        if trees.is_dir():
            for entry in os.scandir(trees):
                if entry.name.startswith("."):
                    continue  # an unpack in progress, or one a killed runner left (removed later)
                total += archives.tree_bytes(Path(entry.path))
        return total

    def touch(self, asset: Asset, *, fetched: bool = False, source: str | None = None) -> None:
        """Record in meta/ that the asset was used now (and fetched, from where)."""
        path = self.meta(hex_of(asset))
        try:
            meta: dict[str, Any] = json.loads(path.read_bytes())
        except (OSError, ValueError):
            meta = {}
        now = store.now()
        meta.update(sha256=asset.sha256, size=asset.size, lastUsedAt=now)
        meta["ids"] = sorted({*meta.get("ids", []), asset.id})
        if fetched:
            meta["fetchedAt"] = now
            if source is not None:
                meta["source"] = redacted(source)
        meta.setdefault("fetchedAt", now)
        write_json(path, meta)


@dataclass(frozen=True)
class Fetched:
    """One asset, as the cache has it now."""

    id: str
    sha256: str
    size: int
    path: Path
    """What is mounted (the bytes, or their unpacked folder)."""
    cached: bool
    """It was in the cache already: nothing was downloaded."""
    downloaded: int
    """Bytes received from sources by this fetch (less than size after a resume)."""
    source: str | None
    seconds: float

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "sha256": self.sha256,
            "size": self.size,
            "cachePath": str(self.path),
            "cached": self.cached,
            "downloadedBytes": self.downloaded,
            "source": redacted(self.source) if self.source else None,
            "seconds": round(self.seconds, 3),
        }


def _is_url(source: str) -> bool:
    return source.split(":", 1)[0].lower() in ("http", "https")


def fetch(
    asset: Asset,
    base_dir: Path,
    cache: AssetCache,
    grant: AssetGrant,
    *,
    on_bytes: OnBytes | None = None,
    lock_timeout: float | None = None,
) -> Fetched:
    """Make sure ``asset`` is in the cache, verified (and unpacked); download it at most once
    however many runners ask at the same time (waiting on another's fetch at most
    ``lock_timeout`` seconds; None: as long as it takes). Raises :class:`AssetDigestMismatch`
    for wrong bytes and :class:`AssetUnavailable` when no source gives it."""
    since = time.monotonic()
    hexd = hex_of(asset)
    with cache.locked(hexd, timeout=lock_timeout) as got:
        if not got:
            raise _busy(asset, lock_timeout)
        if cache.present(asset):
            cache.touch(asset)
            return Fetched(asset.id, asset.sha256, asset.size, cache.mount_source(asset), True,
                           0, None, time.monotonic() - since)  # fmt: skip
        blob = cache.blob(hexd)
        received, source = 0, None
        if not (blob.exists() and os.lstat(blob).st_size == asset.size):
            _check_room(cache, grant, asset)
            received, source = _from_sources(asset, base_dir, cache, grant, on_bytes)
        if asset.unpack:
            _unpack(asset, cache, grant)
        cache.touch(asset, fetched=True, source=source)
    return Fetched(asset.id, asset.sha256, asset.size, cache.mount_source(asset), False,
                   received, source, time.monotonic() - since)  # fmt: skip


def _from_sources(
    asset: Asset, base_dir: Path, cache: AssetCache, grant: AssetGrant, on_bytes: OnBytes | None
) -> tuple[int, str]:
    hexd = hex_of(asset)
    d = Download(asset, cache.partial(hexd), on_bytes)
    tried: list[str] = []
    wrong: WrongBytes | None = None
    for source in asset.sources:
        try:
            d.begin(source)  # a partial file from another source is not resumed: started over
            if _is_url(source):
                for attempt in retrying(grant):
                    with attempt:
                        http(source, d, grant)
            else:
                local(base_dir, source, d)
            d.finish()
        except WrongBytes as exc:
            wrong = wrong or exc
            tried.append(f"{redacted(source)}: wrong bytes")
            continue
        except (Transient, SourceFailed) as exc:
            tried.append(f"{redacted(source)}: {exc}")
            continue
        blob = cache.blob(hexd)
        with d.partial.open("rb+") as f:
            os.fsync(f.fileno())
        os.chmod(d.partial, 0o444)
        os.replace(d.partial, blob)
        archives.sync_folders(blob.parent, below=False)  # the rename itself on disk
        d.done()
        return d.received, source
    if not d.partial.exists():
        d.done()  # nothing to resume: no record of where it came from either
    if wrong is not None:
        why = f" ({wrong.why})" if wrong.why else ""
        raise AssetDigestMismatch(
            f"$.assets: asset {asset.id!r}: the bytes from its source are not the ones the "
            f"contract binds: expected {asset.sha256} ({asset.size:,} bytes), got "
            f"{wrong.digest} ({wrong.size:,} bytes){why}; nothing was cached",
            hint="fix the source, or the contract's sha256 and size if the source is right "
            "(and sign it again)",
        )
    answers = "; ".join(tried) or "it lists no source"
    raise AssetUnavailable(
        f"asset {asset.id!r} ({asset.sha256}) could not be fetched: {answers}",
        hint=f"{len(tried)} source(s) tried, each named with its answer ({answers[:300]}); fix "
        "the source that should serve it, and check that the host policy's assets.allowHosts "
        "names its host",
    )


def _unpack(asset: Asset, cache: AssetCache, grant: AssetGrant) -> None:
    hexd = hex_of(asset)
    kind = asset.unpack
    if kind is None:
        return
    dest = cache.tree(hexd, kind)
    if dest.is_dir():
        return
    archives.remove_stale(dest.parent, dest.name)  # what a killed unpack left (we hold the lock)
    try:
        _files, size = archives.unpack(
            cache.blob(hexd), kind, dest,
            max_bytes=grant.maxUnpackedBytes, max_files=grant.maxUnpackedFiles,
        )  # fmt: skip
    except archives.UnsafeArchive as exc:
        err = AssetUnavailable(
            f"$.assets: asset {asset.id!r} ({asset.sha256}): its {kind} archive is refused: {exc}",
            hint="repack it with regular files and folders only, or raise the host policy's "
            "assets.maxUnpackedBytes / maxUnpackedFiles if it is only large",
        )
        err.retryable = False
        raise err from None
    if grant.cacheMaxBytes is not None and cache.usage() > grant.cacheMaxBytes:
        archives.remove_tree(dest)
        raise _over_cache(asset, grant, size)


def _busy(asset: Asset, waited: float | None) -> AssetUnavailable:
    return AssetUnavailable(
        f"$.assets: asset {asset.id!r} ({asset.sha256}): another runner has been fetching it "
        f"(holding its lock) for more than the {waited or 0:g} s this job waits",
        hint="try again once that fetch ends (`runner cache ls` lists the cache), or fetch it "
        "first with `runner fetch CONTRACT`",
    )


def _check_room(cache: AssetCache, grant: AssetGrant, asset: Asset) -> None:
    if grant.cacheMaxBytes is None:
        return
    if cache.usage() + asset.size > grant.cacheMaxBytes:
        raise _over_cache(asset, grant, asset.size)


def _over_cache(asset: Asset, grant: AssetGrant, size: int) -> AssetUnavailable:
    return AssetUnavailable(
        f"asset {asset.id!r} ({size:,} bytes) does not fit in the asset cache: it would hold "
        f"more than the host policy's assets.cacheMaxBytes ({grant.cacheMaxBytes:,})",
        hint="make room with `runner cache prune --max-bytes N`, or raise cacheMaxBytes",
    )


def stage(
    job: JobDir,
    contract: VerifiedContract,
    cache: AssetCache,
    grant: AssetGrant,
    *,
    on_fetched: Callable[[Fetched], None] | None = None,
    lock_timeout: float = STAGE_LOCK_WAIT,
) -> list[Mount]:
    """The job's assets, cached (fetched first where the policy allows), as read-only mounts
    at ``/job/assets/<path>``; what the job uses is recorded first (``record/assets.json``).
    Waits at most ``lock_timeout`` seconds on another runner's fetch of one asset."""
    wanted = contract.model.fetched_assets
    if not wanted:
        return []
    record = {
        "schemaVersion": "1.0",
        "assets": [
            {"id": a.id, "sha256": a.sha256, "size": a.size, "path": a.path, "unpack": a.unpack}
            for a in wanted
        ],
    }
    write_json(job.record / RECORD, record)
    mounts = []
    for a in wanted:
        if grant.fetchOnRun:
            got = fetch(a, contract.base_dir, cache, grant, lock_timeout=lock_timeout)
            if on_fetched is not None:
                on_fetched(got)
        else:  # only what is cached already
            with cache.locked(hex_of(a), timeout=lock_timeout) as locked:
                if not locked:
                    raise _busy(a, lock_timeout)
                if not cache.present(a):
                    raise AssetUnavailable(
                        f"$.assets: asset {a.id!r} ({a.sha256}) is not in this host's asset "
                        "cache, and the host policy does not fetch assets on run",
                        hint="fetch it first with `runner fetch CONTRACT` (same --state-dir), "
                        "or set assets.fetchOnRun in the host policy",
                    )
                cache.touch(a)
            if on_fetched is not None:
                on_fetched(Fetched(a.id, a.sha256, a.size, cache.mount_source(a), True, 0, None,
                                   0.0))  # fmt: skip
        mounts.append(Mount(cache.mount_source(a), f"/job/assets/{a.path}", read_only=True))
        _mount_point(job, a)
    return mounts


def _mount_point(job: JobDir, asset: Asset) -> None:
    """The empty file or folder in the job's assets/ the asset is mounted over (the engine
    cannot make one below the read-only /job/assets)."""
    parent = asset.path.rpartition("/")[0]
    try:
        if parent:
            safefs.makedirs_under(job.assets, parent)
        if asset.unpack:
            safefs.makedirs_under(job.assets, asset.path)
        elif not (job.assets / asset.path).is_file():
            atomic_write(job.assets / asset.path, b"", 0o444)
    except (safefs.UnsafePath, OSError) as exc:
        raise PolicyViolation(
            f"$.assets: asset {asset.id!r}: its path {asset.path!r} cannot be placed under "
            f"/job/assets: {exc}",
            hint="give each asset a path of its own (a file and a folder cannot share one)",
        ) from None


def used_by(job: JobDir) -> list[str]:
    """The asset digests (hex) a job's record says it uses."""
    try:
        data = json.loads((job.record / RECORD).read_bytes())
        return [str(a["sha256"]).removeprefix("sha256:") for a in data.get("assets", [])]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []
