"""Long on purpose: the input cache is one store with its whole life (made, checked on each
use, re-hashed, removed) in one place, so the rules on when a cached byte may be used are read
together.

The input cache: a contract's inputs (paper, repository, agent prompt), kept once per digest
and hard-linked into the next job's ``input/`` instead of copied and hashed again.

Layout of ``<state>/cache/inputs/``::

    entries/<hex>/data           the input as staged: a file, or a folder (files 0444, or 0555
                                 when executable; folders 0555; links as links)
    entries/<hex>/manifest.json  its kind, runner-tree-v1 listing, and each file's size, inode
                                 and modification time when the entry was made (0444)
    tmp/                         entries being built (renamed into entries/ whole)
    locks/<hex>.lock             flock(2) per digest (:mod:`runner.core.locks`, as the asset cache)
    meta/<hex>.json              the paths it was staged as, when made, when last used, and
                                 each file's stamp as last seen whole (``seen``)

``<hex>`` is the hex of the input's digest (:mod:`runner.staging.inputs`: SHA-256 of a file's
bytes, or
of a folder's runner-tree-v1 listing).

**A job's staging** (:func:`stager`, handed to :func:`runner.staging.jobdir.stage_inputs`): the
digest
the contract binds is written to ``record/inputs.json`` first (so ``runner cache prune`` never
removes what a job that has not ended uses), then, under the digest's lock, an entry found is
hard-linked into ``input/`` file by file: the source beside the contract is not opened, not
walked, not hashed (the contract's signature covers the digest; the entry was hashed when it
was made, and its manifest's listing must hash to its name). Each cached file is checked on the
way (``lstat``: a regular file with the inode, size, modification time and read-only mode it had
when made, and the device, inode, size, mtime and *ctime* of its :func:`stamp` when the runner
last saw it whole: made, verified or linked, kept in meta/). A user can restore an mtime but not
a ctime, so a file whose stamp differs (edited, even same size with its mtime put back; or only
linked or unlinked by a job folder) is re-hashed before it is linked. A file edited, replaced or
made writable on the host fails, the entry is removed and the input is staged from its source
as before. What changes between the check and the link, or during the job, the re-hash of
``input/`` after the job finds: the run is then ``input_digest_mismatch`` and the entries the
job used are re-hashed (:func:`verify_used`); ``runner cache verify`` re-hashes every entry.

Without a digest in the contract, or without an entry, the input is copied and hashed as before,
and the copy just made becomes the entry: its files are hard-linked (not copied again) into a
new folder under ``tmp/``, made read-only, and renamed into ``entries/``. A link that fails
(another file system: EXDEV; EPERM; too many links: EMLINK) means no entry (and, when placing
one, a plain copy of that file).

**Nothing a job does reaches a cached byte.** ``input/`` is mounted read-only; ``workspace/
repository`` is a copy (:func:`runner.execution.layout.working_copy`), never a link; the runner
never
hands a file with more than one link to the job's user
(:func:`runner.staging.jobdir.prepare_writable`);
and inside the container ``link(2)`` from the read-only ``/job/input`` mount into a writable one
fails (EXDEV), so a job cannot make such a link itself. A job re-graded later still finds its
exact bytes: its ``input/`` holds its own links to them, which ``runner cache prune`` does not
touch (pruning an entry frees its bytes only once no job folder links them).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.caches import store
from runner.caches.store import Store
from runner.core import archives, log, safefs
from runner.staging import inputs
from runner.staging.jobdir import StagedFile, StagedInput, Stager
from runner.state.jobdir import JobDir, write_json

__all__ = ["InputCache", "Staged", "stager", "stamp", "used_by", "verify", "verify_used"]

RECORD = "inputs.json"
_HEX = re.compile(r"^[0-9a-f]{64}$")
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
_NO_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK)
_MAX_MANIFEST = 256 * 1024 * 1024


class Stale(Exception):
    """A cached entry is not what it was when made."""


def hex_of(digest: str | None) -> str | None:
    match = _DIGEST.match(digest or "")
    return match.group(1) if match else None


@dataclass(frozen=True)
class InputCache(Store):
    """The content-addressed input cache below the state folder."""

    NAME = "inputs"
    FOLDERS = ("entries", "tmp", "meta", "locks")

    def entry(self, hexd: str) -> Path:
        return self.root / "entries" / hexd

    def data(self, hexd: str) -> Path:
        return self.entry(hexd) / "data"

    def manifest(self, hexd: str) -> Path:
        return self.entry(hexd) / "manifest.json"

    def hexes(self) -> list[str]:
        folder = self.root / "entries"
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if _HEX.match(p.name))

    def read_manifest(self, hexd: str) -> dict[str, Any] | None:
        """The entry's manifest, if it is there and names this digest (its listing, or its one
        file's SHA-256, hashes to the entry's name); None when there is no usable entry."""
        try:
            with self.manifest(hexd).open("rb") as f:
                m: dict[str, Any] = json.loads(f.read(_MAX_MANIFEST))
            if m.get("kind") == "folder":
                listing = str(m["listing"])
                ok = inputs.digest_of(listing.encode()) == f"sha256:{hexd}"
                ok = ok and _rows_match(m["entries"], inputs.parse_listing(listing))
            else:
                rows = m["entries"]
                ok = m.get("kind") == "file" and len(rows) == 1 and rows[0]["path"] == ""
                ok = ok and rows[0]["sha256"] == hexd and rows[0]["kind"] in ("F", "X")
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
            return None
        return m if ok else None

    def remove(self, hexd: str) -> None:
        """Remove an entry (under its lock): renamed away first, so it is never seen half gone.
        Job folders that link its files keep their bytes."""
        entry = self.entry(hexd)
        if not os.path.lexists(entry):
            self.meta(hexd).unlink(missing_ok=True)
            return
        self.prepare()
        gone = self.root / "tmp" / f"gone-{hexd}-{uuid.uuid4().hex[:8]}"
        os.rename(entry, gone)
        archives.remove_tree(gone)
        self.meta(hexd).unlink(missing_ok=True)

    def remove_debris(self) -> list[str]:
        """Remove what a runner killed while making or removing an entry left in ``tmp/``
        (``<hex>.<random>``, ``gone-<hex>-<random>``), each under its digest's lock (never
        while another runner is at it); the names removed."""
        folder = self.root / "tmp"
        if not folder.is_dir():
            return []
        removed = []
        for path in sorted(folder.iterdir()):
            hexd = path.name.removeprefix("gone-")[:64]
            if not _HEX.match(hexd):
                continue
            with self.locked(hexd, wait=False) as got:
                if got and os.path.lexists(path):
                    if path.is_dir() and not path.is_symlink():
                        archives.remove_tree(path)
                    else:
                        path.unlink()
                    removed.append(path.name)
        return removed

    def _read_meta(self, hexd: str) -> dict[str, Any]:
        try:
            meta = json.loads(self.meta(hexd).read_bytes())
        except (OSError, ValueError):
            return {}
        return meta if isinstance(meta, dict) else {}

    def seen(self, hexd: str) -> dict[str, list[int]]:
        """Each cached file's :func:`stamp` when the runner last saw it whole (made, verified
        or linked); what is missing or malformed is simply not known (re-hashed on use)."""
        got = self._read_meta(hexd).get("seen")
        if not isinstance(got, dict):
            return {}
        return {
            str(k): v
            for k, v in got.items()
            if isinstance(v, list) and len(v) == 5 and all(type(x) is int for x in v)
        }

    def touch(
        self,
        hexd: str,
        path: str | None,
        *,
        made: bool = False,
        seen: dict[str, list[int]] | None = None,
    ) -> None:
        """Record in meta/ that the entry was used now (staged as ``path``; None: only
        checked), and, given ``seen``, its files' stamps as just seen."""
        file = self.meta(hexd)
        meta = self._read_meta(hexd)
        now = store.now()
        meta["digest"] = f"sha256:{hexd}"
        if path is not None:
            meta["lastUsedAt"] = now
            meta["paths"] = sorted({*meta.get("paths", []), path})
            if made or "madeAt" not in meta:
                meta["madeAt"] = now
        if seen is not None:
            meta["seen"] = seen
        # Not fsynced: a meta file a host crash left unreadable reads as {} (_read_meta),
        # and then no stamp is trusted (the entry's files are hashed again), never more.
        write_json(file, meta, durable=False)

    def usage(self, hexd: str) -> int:
        m = self.read_manifest(hexd)
        return int(m.get("bytes", 0)) if m else 0


def _rows_match(rows: list[dict[str, Any]], listed: dict[str, inputs.Entry]) -> bool:
    """The manifest's rows are exactly its listing's entries, in an order that makes each
    folder before what is in it, and every path stays below the entry (no ``..``, nothing
    absolute, no empty part): what :func:`place` may follow."""
    seen: set[str] = set()
    for row in rows:
        path = str(row["path"])
        parts = path.split("/")
        if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            return False
        if len(parts) > 1 and "/".join(parts[:-1]) not in seen:
            return False
        want = listed.get(path)
        if want is None or want.kind != row["kind"] or want.sha256 != row.get("sha256", ""):
            return False
        seen.add(path)
    return len(seen) == len(listed) == len(rows)


# -- making an entry --------------------------------------------------------------------------


def _file_row(e: inputs.Entry | None, path: str, st: os.stat_result, sha: str) -> dict[str, Any]:
    kind = e.kind if e is not None else ("X" if st.st_mode & stat.S_IXUSR else "F")
    return {
        "kind": kind,
        "path": path,
        "sha256": sha,
        "size": st.st_size,
        "ino": st.st_ino,
        "mtimeNs": st.st_mtime_ns,
    }


def _read_only(kind: str) -> int:
    return 0o555 if kind == "X" else 0o444


def add(cache: InputCache, got: StagedInput, staged_at: Path) -> dict[str, list[int]] | None:
    """Make ``got`` (just staged, hashed, at ``staged_at``) an entry by hard-linking its files
    (never copying them); call under the digest's lock. Each file's :func:`stamp` once made
    read-only (for :meth:`InputCache.touch`); None when no entry was made (a link failed:
    another file system, or too many links)."""
    hexd = hex_of(got.digest)
    if hexd is None or os.path.lexists(cache.entry(hexd)):
        return None
    seen: dict[str, list[int]] = {}
    cache.prepare()
    tmp = cache.root / "tmp" / f"{hexd}.{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        data = tmp / "data"
        rows: list[dict[str, Any]] = []
        if got.entries is None:
            kind = "X" if got.executable else "F"
            os.link(staged_at, data, follow_symlinks=False)
            os.chmod(data, _read_only(kind))
            st = os.lstat(data)
            seen[""] = stamp(st)
            rows.append(_file_row(None, "", st, got.files[0].sha256) | {"kind": kind})
        else:
            data.mkdir()
            folders = []
            for e in sorted(got.entries.values(), key=lambda e: e.path.encode()):
                src, dst = staged_at / e.path, data / e.path
                if e.kind == "D":
                    dst.mkdir()
                    folders.append(dst)
                    rows.append({"kind": "D", "path": e.path})
                    continue
                os.link(src, dst, follow_symlinks=False)
                if e.kind != "L":
                    os.chmod(dst, _read_only(e.kind))
                st = os.lstat(dst)
                if e.kind != "L":
                    seen[e.path] = stamp(st)
                rows.append(_file_row(e, e.path, st, e.sha256))
            for folder in [*reversed(folders), data]:
                os.chmod(folder, 0o555)  # noqa: S103 - read-only to everyone, owner included
        manifest = {
            "schemaVersion": "1.0",
            "digest": got.digest,
            "kind": "file" if got.entries is None else "folder",
            "listing": inputs.listing(got.entries.values()) if got.entries is not None else None,
            "bytes": sum(int(r.get("size", 0)) for r in rows),
            "entries": rows,
        }
        write_json(tmp / "manifest.json", manifest)
        os.chmod(tmp / "manifest.json", 0o444)
        os.rename(tmp, cache.entry(hexd))
    except OSError as exc:
        archives.remove_tree(tmp)
        if exc.errno in _NO_LINK:
            return None
        raise
    return seen


# -- placing an entry -------------------------------------------------------------------------


def stamp(st: os.stat_result) -> list[int]:
    """What shows a cached file unchanged since it was last seen: its device, inode, size,
    modification time and change time (ns). A user can restore a file's mtime (``utime``)
    but not its ctime: any write, chmod, utime or link sets it to now."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _rehash(path: str | Path, row: dict[str, Any], st: os.stat_result) -> None:
    """Hash the cached file (opened without following a link, the inode ``lstat`` saw) and
    compare with its row; it must not change while it is read."""
    name = row["path"] or "the file"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise Stale(f"{name} cannot be read: {exc.strerror}") from None
    try:
        before = os.fstat(fd)
        if stamp(before) != stamp(st):
            raise Stale(f"{name} changed while it was checked")
        digest = hashlib.sha256()
        size = safefs.copy_sparse(fd, None, before.st_size, digest)
        if size != row["size"] or digest.hexdigest() != row["sha256"]:
            raise Stale(f"{name} does not hash to what was cached")
        if stamp(os.fstat(fd)) != stamp(before):
            raise Stale(f"{name} changed while it was hashed")
    finally:
        os.close(fd)


def _fresh(path: str | Path, row: dict[str, Any], seen: list[int] | None = None,
           *, rehash: bool = True) -> os.stat_result | None:  # fmt: skip
    """The cached file is as it was made: a read-only regular file with the inode, size and
    mtime it was cached with, and (cheap: one lstat) the device, inode, size, mtime and ctime
    it had when last seen (``seen``: when it was cached, verified or last linked). When it
    cannot be shown unchanged so (``seen`` differs or is unknown), it is re-hashed (unless
    ``rehash`` is off: the caller hashes it). Its lstat (None for a link, whose target is
    re-hashed)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise Stale(f"{row['path'] or 'the file'} cannot be read: {exc.strerror}") from None
    if row["kind"] == "L":
        target = os.readlink(path) if stat.S_ISLNK(st.st_mode) else ""
        if hashlib.sha256(os.fsencode(target)).hexdigest() != row["sha256"]:
            raise Stale(f"{row['path']} is not the link it was")
        return None
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISREG(st.st_mode) or mode != _read_only(row["kind"]):
        raise Stale(f"{row['path'] or 'the file'} is no longer a read-only file ({mode:o})")
    if (st.st_ino, st.st_size, st.st_mtime_ns) != (row["ino"], row["size"], row["mtimeNs"]):
        raise Stale(f"{row['path'] or 'the file'} was replaced or changed since it was cached")
    if rehash and stamp(st) != seen:
        _rehash(path, row, st)
    return st


def _place(src: str | Path, dst: str | Path, row: dict[str, Any]) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
        if row["kind"] == "L":
            os.symlink(os.readlink(src), dst)
        else:  # the bytes checked by _fresh; a copy the job cannot reach the cache through
            _copy_out(src, dst, 0o755 if row["kind"] == "X" else 0o644)


def _copy_out(src: str | Path, dst: str | Path, mode: int) -> None:
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        out = os.open(dst, flags, mode)
        try:
            safefs.copy_sparse(fd, out, os.fstat(fd).st_size)
            os.fchmod(out, mode)
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _seen_after(src: str | Path, before: os.stat_result | None, row: dict[str, Any]) -> list[int]:
    """The stamp of the cached file once placed (linking it set its ctime): the same file,
    same size and mtime, as just checked."""
    st = os.lstat(src)
    if before is None or stamp(st)[:4] != stamp(before)[:4]:
        raise Stale(f"{row['path'] or 'the file'} changed while it was placed")
    return stamp(st)


def place(cache: InputCache, hexd: str, m: dict[str, Any], field: str, rel: str,
          input_root: Path, seen: dict[str, list[int]] | None = None) -> StagedInput:  # fmt: skip
    """Hard-link the entry into ``input_root/rel``; the staged input it stands for. Raises
    :class:`Stale` (leaving nothing at ``input_root/rel``) when a cached file has changed.
    ``seen``: each file's :func:`stamp` when last seen, read from the entry's meta (a file
    whose stamp differs is re-hashed before it is linked), updated in place to the stamps
    after linking."""
    seen = {} if seen is None else seen
    data = cache.data(hexd)
    dst = input_root / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = m["entries"]
    try:
        if m["kind"] == "file":
            row = rows[0]
            st = _fresh(data, row, seen.get(""))
            _place(data, dst, row)
            seen[""] = _seen_after(data, st, row)
            files = [StagedFile(rel, row["sha256"], row["size"])]
            return StagedInput(field, rel, m["digest"], None, files, row["kind"] == "X")
        dst.mkdir()
        files, found = [], {}
        src_at, dst_at = str(data), str(dst)  # plain strings: pathlib costs more than link(2)
        for row in rows:
            path = row["path"]
            if row["kind"] == "D":
                os.mkdir(f"{dst_at}/{path}")
                found[path] = inputs.Entry("D", path)
                continue
            src = f"{src_at}/{path}"
            st = _fresh(src, row, seen.get(path))
            _place(src, f"{dst_at}/{path}", row)
            if st is not None:
                seen[path] = _seen_after(src, st, row)
            files.append(StagedFile(f"{rel}/{path}", row["sha256"], row["size"],
                                    link=row["kind"] == "L"))  # fmt: skip
            found[path] = inputs.Entry(row["kind"], path, row["sha256"])
        return StagedInput(field, rel, m["digest"], found, files)
    except BaseException:
        if dst.is_dir() and not dst.is_symlink():
            shutil.rmtree(dst)
        elif os.path.lexists(dst):
            dst.unlink()
        raise


# -- a job's use ------------------------------------------------------------------------------


def _record(job: JobDir, field: str, digest: str) -> None:
    path = job.record / RECORD
    try:
        data: dict[str, Any] = json.loads(path.read_bytes())
        used = [u for u in data["inputs"] if u.get("field") != field]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        used = []
    used.append({"field": field, "digest": digest})
    # Not fsynced: `runner cache prune` on this host reads it through the page cache; after
    # a host crash no job of this host is running, and a new attempt stages (and writes it)
    # again.
    write_json(path, {"schemaVersion": "1.0", "inputs": used}, durable=False)


def used_by(job: JobDir) -> list[str]:
    """The input digests (hex) a job's record says it uses."""
    try:
        data = json.loads((job.record / RECORD).read_bytes())
        found = (hex_of(str(u["digest"])) for u in data.get("inputs", []))
        return [h for h in found if h is not None]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []


@dataclass
class Staged:
    """What :func:`stager` did, input by input (for progress and the benchmark)."""

    linked: list[str]
    copied: list[str]
    cached: list[str]
    """Inputs copied now and kept in the cache for the next job."""


def stager(cache: InputCache, job: JobDir, *, done: Staged | None = None) -> Stager:
    """The :data:`runner.staging.jobdir.Stager` that stages through ``cache``."""
    (job.record / RECORD).unlink(missing_ok=True)  # describes an earlier staging

    def stage(
        field: str, rel: str, bound: str | None, copy: Callable[[], StagedInput]
    ) -> tuple[StagedInput, bool]:
        hexd = hex_of(bound)
        if hexd is not None and bound is not None:
            _record(job, field, bound)  # before the cache is looked at
            with cache.locked(hexd):
                m = cache.read_manifest(hexd)
                if m is not None:
                    seen = cache.seen(hexd)
                    try:
                        got = place(cache, hexd, m, field, rel, job.input, seen)
                    except Stale as exc:
                        log.event(
                            logging.WARNING,
                            f"input cache entry sha256:{hexd[:12]}… for {field} is not as it "
                            f"was made ({exc}); removed it, staging from the source",
                        )
                        cache.remove(hexd)
                    else:
                        cache.touch(hexd, rel, seen=seen)
                        if done is not None:
                            done.linked.append(field)
                        return got, True
        got = copy()
        if done is not None:
            done.copied.append(field)
        made = hex_of(got.digest)
        if made is None or (bound is not None and bound != got.digest):
            return got, False  # refused next (not the input the contract binds): never cached
        _record(job, field, got.digest)
        with cache.locked(made):
            stamps = None  # an entry there already: its stamps as they were
            if cache.read_manifest(made) is None:
                if os.path.lexists(cache.entry(made)):
                    cache.remove(made)  # unusable (a manifest lost): made again below
                stamps = add(cache, got, job.input / rel)
                if stamps is not None and done is not None:
                    done.cached.append(field)
            cache.touch(made, rel, made=True, seen=stamps)
        return got, False

    return stage


# -- checking every entry ---------------------------------------------------------------------


def verify_entry(cache: InputCache, hexd: str) -> str | None:
    """Re-hash an entry's every file against its manifest, and its listing against its name;
    None when it is whole (its files' stamps then recorded as seen), else what is wrong."""
    m = cache.read_manifest(hexd)
    if m is None:
        return "its manifest is missing, unreadable or not this digest's"
    data = cache.data(hexd)
    seen: dict[str, list[int]] = {}
    for row in m["entries"]:
        path = data / row["path"] if row["path"] else data
        if row["kind"] == "D":
            if not path.is_dir() or path.is_symlink():
                return f"{row['path']} is not a folder"
            continue
        try:
            st = _fresh(path, row, rehash=False)
            if st is not None:
                _rehash(path, row, st)
                seen[row["path"]] = stamp(st)
        except (Stale, OSError) as exc:
            return str(exc)
    cache.touch(hexd, None, seen=seen)
    return None


def verify(cache: InputCache, *, remove: bool = True) -> dict[str, str]:
    """Every entry re-hashed; hex -> problem of each entry that is not whole (removed unless
    ``remove`` is off: the next job stages that input from its source again)."""
    bad: dict[str, str] = {}
    for hexd in cache.hexes():
        with cache.locked(hexd):
            problem = verify_entry(cache, hexd)
            if problem is not None:
                bad[hexd] = problem
                if remove:
                    cache.remove(hexd)
    return bad


def verify_used(cache: InputCache, job: JobDir) -> list[str]:
    """Re-hash the entries ``job`` was staged from (its ``record/inputs.json``) and remove
    those that are not whole: after a job whose ``input/`` changed (its files are the cached
    inodes), so no later job is handed the changed bytes. The hexes removed."""
    bad = []
    for hexd in used_by(job):
        with cache.locked(hexd):
            if os.path.lexists(cache.entry(hexd)) and verify_entry(cache, hexd) is not None:
                cache.remove(hexd)
                bad.append(hexd)
    return bad
