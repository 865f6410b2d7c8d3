"""An agent runtime brought into the contract's image: its files, cached, checked, mounted.

Long on purpose: one cache entry's life — extracted, sealed, held by an attempt, re-checked,
pruned, verified — keeps the same invariants (the runner's own files, never mounted
writable, unchanged since hashed) and reads best in one place; whether a runtime fits an
image is :mod:`runner.execution.agentfit`'s.

An agent_planned contract's ``environment.image`` is the job's image, as for a fixed
entrypoint: the agent's commands (its Bash tool, the evaluation it runs) run in the paper's
own environment. The agent runtime comes from its adapter's pinned image instead: the paths
the adapter names (``runtimePaths``: for Claude Code the native binary and its wrapper) are
copied out of that image through the engine's archive API (a container made of it and never
started), unpacked by the runner's one safe-tar reader (:func:`runner.core.archives.unpack_tars`:
no links, no devices, caps on files and bytes) into a content-addressed cache entry of the
state folder, one per runtime image id (and set of paths), each file's SHA-256 recorded in the
entry's ``runtime.json``. An attempt mounts the entry's ``files/`` read-only at
``/opt/runner-agent`` (each path under its base name) and puts that folder first on ``PATH``.

Extraction happens once per runtime image id: later attempts (and jobs) reuse the entry after
checking that each recorded file is still there, the same size, mode and inode, unchanged
since it was hashed (a full re-hash would cost a 400 MB binary half a second an attempt; the
entry is the runner's, read-only, never mounted writable). An entry that fails the check is
removed and extracted again.

Before an attempt starts, :func:`runner.execution.agentfit.check_fits` asks whether the runtime
can run in the contract's image (reading that image's files, running nothing); a pair found to
fit is remembered here (images are immutable by id), so a cached attempt asks the engine
nothing but the runtime image's inspect.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.backends.base import Backend, ContainerSpec, ImageInfo, Mount
from runner.core import archives, locks, safefs
from runner.core.errors import PolicyViolation
from runner.execution.agentfit import FIT_CHECK, MOUNT, check_fits, image_path
from runner.images.pins import Acquired, ImagePin
from runner.models.envelope import ImageRecord
from runner.planning.plan import ExecutionPlan

__all__ = [
    "IN_USE_LABEL",
    "Brought",
    "Pruned",
    "Runtime",
    "bring",
    "cache_root",
    "describe",
    "ensure",
    "fits_root",
    "locks",
    "prune",
    "release",
    "users",
    "verify",
]


MAX_BYTES = 4 * 1024**3
"""The most bytes a runtime's files may hold (Claude Code's binary is about 400 MB)."""
MAX_FILES = 20_000


@dataclass(frozen=True)
class RuntimeFile:
    path: str
    """Relative to the runtime's folder (and to /opt/runner-agent)."""
    sha256: str
    size: int
    executable: bool


@dataclass(frozen=True)
class Runtime:
    """A runtime image's files, extracted and verified: what an attempt mounts."""

    image_id: str
    paths: tuple[str, ...]
    """The adapter's runtimePaths, as copied out of the image."""
    folder: Path
    """The tree mounted at :data:`MOUNT`."""
    files: tuple[RuntimeFile, ...]
    digest: str
    """SHA-256 of the entry's canonical file list (path, digest, size, mode): the runtime's
    content, as the envelope records it."""
    extracted: bool
    """Whether this call copied it out of the image (False: the cache had it)."""
    seconds: float = 0.0

    def record(self) -> dict[str, Any]:
        return {
            "paths": list(self.paths),
            "mountedAt": MOUNT,
            "filesDigest": self.digest,
            "files": [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in self.files],
        }


def cache_root(state_root: Path) -> Path:
    return state_root / "cache" / "agent-runtimes"


def fits_root(state_root: Path) -> Path:
    """Where a (contract image, runtime) pair found to fit is remembered: one file each."""
    return state_root / "cache" / "agent-runtime-fits"


def _key(image_id: str, paths: Sequence[str]) -> str:
    hexd = image_id.removeprefix("sha256:")
    tail = hashlib.sha256("\0".join(paths).encode()).hexdigest()[:16]
    return f"{hexd}-{tail}"


def _files_digest(files: Sequence[RuntimeFile]) -> str:
    canon = json.dumps(
        [[f.path, f.sha256, f.size, f.executable] for f in files], separators=(",", ":")
    )
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


def ensure(
    backend: Backend,
    image_id: str,
    paths: Sequence[str],
    root: Path,
    labels: Mapping[str, str],
) -> Runtime:
    """The runtime files ``paths`` of the image ``image_id``: from the cache under ``root``
    when an entry is there and checks out, else copied out of the image now (once: a lock per
    entry holds other runners back until it is whole)."""
    started = time.monotonic()
    key = _key(image_id, paths)
    entry = root / key
    root.mkdir(parents=True, exist_ok=True)
    _refuse_shared(root)
    with locks.flocked(root / f".{key}.lock"):
        _touch(root, key)  # before it is used: prune keeps what was just used
        known = _load(entry, image_id, tuple(paths))
        if known is None:
            archives.remove_tree(entry)
            archives.remove_stale(root, key)
            known = _extract(backend, image_id, tuple(paths), entry, dict(labels))
        _hold(root, key)  # taken under the entry's lock: prune cannot come in between
    return dataclasses.replace(known, seconds=round(time.monotonic() - started, 3))


_HELD: dict[Path, int] = {}
"""This process's shared locks on ``.<entry>.inuse``: an entry checked for an attempt that
has not mounted it yet (or runs it now) is busy for prune and verify."""


def _inuse(root: Path, key: str) -> Path:
    return root / f".{key}.inuse"


def _hold(root: Path, key: str) -> None:
    path = _inuse(root, key)
    if path in _HELD:
        return
    fd = locks.open_own_lock_file(path)
    locks.share(fd)
    _HELD[path] = fd


def release(runtime: Runtime) -> None:
    """The attempt is done with the entry (its container ended, or never was): prune and
    verify may remove it again once no container mounts it."""
    entry = runtime.folder.parent
    fd = _HELD.pop(_inuse(entry.parent, entry.name), None)
    if fd is not None:
        os.close(fd)


def _busy(root: Path, key: str) -> bool:
    """Whether a runner holds the entry for an attempt (checked, not yet released); asked
    under the entry's lock, so none can take it meanwhile."""
    fd = locks.open_own_lock_file(_inuse(root, key))
    try:
        return not locks.acquire(fd, wait=False)
    finally:
        os.close(fd)


def _refuse_shared(root: Path) -> None:
    """Refuse a cache whose folder, or either folder above it (the state folder's cache/ and
    the state folder), another user could write: a rename there needs only the parent, so
    they could swap a checked entry for theirs between the check and the engine's bind mount
    (which resolves the path). Owned by the runner's user or root, and no group or other
    write unless sticky (as /tmp is)."""
    for folder in (root, root.parent, root.parent.parent):
        try:
            st = os.lstat(folder)
        except FileNotFoundError:
            continue
        shared = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (os.geteuid(), 0) or shared:
            raise PolicyViolation(
                f"the agent runtimes' cache {root} is not safe: another user can write "
                f"{folder} (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}), and "
                "could swap a checked runtime for theirs before it is mounted",
                hint=f"chmod go-w {folder} (and give it to the runner's user), or use a "
                "state folder only the runner's user can write (--state-dir)",
            )


IN_USE_LABEL = "org.runner.agent-runtime"
"""The label of a container the runtime's entry (its name) is mounted in: the entry is not
pruned or removed while any container carrying it exists."""


def _touch(root: Path, key: str) -> None:
    """Mark the entry used now; a link at the name is not followed (it could make the runner
    create or stamp a file elsewhere: an empty fit file, say)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(root / f".{key}.used", flags, 0o644)
    except OSError:  # a link, or something else there: it is not the runner's mark
        archives.remove_tree(root / f".{key}.used")
        fd = os.open(root / f".{key}.used", flags | os.O_EXCL, 0o644)
    try:
        os.utime(fd)
    finally:
        os.close(fd)


def _write_new(path: Path, data: bytes) -> None:
    """Write ``path`` whole (a new file renamed over it): its temporary name is made anew
    (O_EXCL, no link followed: one planted there would have the runner write through it)."""
    dot = "" if path.name.startswith(".") else "."  # .<entry>.seal.<pid>.tmp, as before
    tmp = path.with_name(f"{dot}{path.name}.{os.getpid()}.tmp")
    archives.remove_tree(tmp)  # a link or a leftover is removed, never followed
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(tmp, flags, 0o644), "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _mine(st: os.stat_result) -> bool:
    """Made by this runner's user and writable by no other: another user who can write into
    the state folder's cache can put files there, never files owned by the runner's user."""
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def recheck(runtime: Runtime) -> None:
    """Just before the entry is mounted: refuse it when it changed since :func:`ensure`
    checked it (staging the inputs can take minutes)."""
    entry = runtime.folder.parent
    if _load(entry, runtime.image_id, runtime.paths) is None:
        raise PolicyViolation(
            f"the agent runtime's cached files at {entry} changed after they were checked; "
            "nothing was mounted",
            hint="run `runner cache verify` (it removes a changed entry) and run the job "
            "again; find out what writes into the state folder's cache",
        )


def users(backend: Backend, entry_name: str) -> list[str]:
    """The containers (any state) the entry is mounted in, by name."""
    return [c.name for c in backend.find({IN_USE_LABEL: entry_name})]


def _extract(
    backend: Backend, image_id: str, paths: tuple[str, ...], entry: Path, labels: dict[str, str]
) -> Runtime:
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
    archives.remove_tree(tmp)
    tmp.mkdir(mode=0o700)
    try:
        tars = []
        with backend.image_files(image_id, labels) as files:
            for i, path in enumerate(paths):
                st = files.stat(path)
                if st is None:
                    raise PolicyViolation(
                        f"agents.runtimePaths: {path} is not in the runtime image {image_id}",
                        hint="name the runtime's files as they are in its image (docker run "
                        "--rm IMAGE ls -l PATH), or fix the image",
                    )
                if st.is_link:
                    raise PolicyViolation(
                        f"agents.runtimePaths: {path} is a link in the runtime image "
                        f"{image_id} (to {st.link_target or '?'}); links are not copied",
                        hint=f"name its target {st.link_target} instead",
                    )
                tar = tmp / f"{i}.tar"
                files.archive(path, tar, MAX_BYTES + 64 * 1024 * 1024)
                tars.append(tar)
        try:
            archives.unpack_tars(tars, tmp / "files", max_bytes=MAX_BYTES, max_files=MAX_FILES)
        except archives.UnsafeArchive as exc:
            raise PolicyViolation(
                f"agents.runtimePaths: the runtime's files in {image_id} cannot be brought "
                f"into the job's image: {exc}",
                hint="name regular files and folders (no links, no two of one base name)",
            ) from None
        for tar in tars:
            tar.unlink()
        listed = _hash_tree(tmp / "files")
        manifest = {
            "imageId": image_id,
            "paths": list(paths),
            "files": [{**_file_json(f), **_stamp(st)} for f, st in listed],
        }
        (tmp / "runtime.json").write_text(json.dumps(manifest, indent=1) + "\n")
        os.chmod(tmp / "runtime.json", 0o444)
        os.chmod(tmp, 0o555)  # noqa: S103 - read-only: r-x for everyone is the point
        archives.sync_folders(tmp, below=False)
        os.rename(tmp, entry)
        archives.sync_folders(entry.parent, below=False)
        _write_seal(entry)
    except BaseException:
        with contextlib.suppress(OSError):
            archives.remove_tree(tmp)
        raise
    got = tuple(f for f, _ in listed)
    return Runtime(image_id, paths, entry / "files", got, _files_digest(got), True)


def _file_json(f: RuntimeFile) -> dict[str, Any]:
    return {"path": f.path, "sha256": f.sha256, "size": f.size, "executable": f.executable}


def _walk_files(folder: Path) -> Iterator[tuple[str, os.stat_result]]:
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(folder / rel if rel else folder) as it:
            for e in it:
                sub = f"{rel}/{e.name}" if rel else e.name
                st = e.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    stack.append(sub)
                else:
                    yield sub, st


def _stamp(st: os.stat_result) -> dict[str, int]:
    """What says a cached file is the one hashed: a rewrite, a chmod, a rename over it or a
    copy put in its place all change one of these (ctime cannot be set back)."""
    return {
        "dev": st.st_dev,
        "inode": st.st_ino,
        "mtimeNs": st.st_mtime_ns,
        "ctimeNs": st.st_ctime_ns,
    }


def _hash_tree(folder: Path) -> list[tuple[RuntimeFile, os.stat_result]]:
    out = []
    for rel, st in sorted(_walk_files(folder)):
        digest = hashlib.sha256()
        with open(folder / rel, "rb", buffering=0) as f:  # written by us just now
            while chunk := f.read(1024 * 1024):
                digest.update(chunk)
        out.append(
            (
                RuntimeFile(rel, "sha256:" + digest.hexdigest(), st.st_size,
                            bool(st.st_mode & 0o111)),
                st,
            )
        )  # fmt: skip
    return out


def _seal_path(entry: Path) -> Path:
    return entry.with_name(f".{entry.name}.seal")


def _seal(entry: Path) -> dict[str, Any]:
    """The entry's folders and manifest as they were when it was made: real folders (no
    link at the entry or its files/), the manifest's digest and stamp."""
    parts: dict[str, Any] = {}
    for rel in ("", "files"):  # the same folders (what is in them is checked file by file)
        st = os.lstat(entry / rel if rel else entry)
        parts[rel or "."] = {"dev": st.st_dev, "inode": st.st_ino, "dir": stat.S_ISDIR(st.st_mode)}
    st = os.lstat(entry / "runtime.json")
    parts["runtime.json"] = {**_stamp(st), "mode": st.st_mode}
    with safefs.open_under(entry, "runtime.json") as f:
        raw = f.read(MAX_MANIFEST + 1)
    parts["sha256"] = hashlib.sha256(raw).hexdigest()
    return parts


def _write_seal(entry: Path) -> None:
    """Kept beside the entry, outside what is mounted: the manifest is checked against it."""
    _write_new(_seal_path(entry), (json.dumps(_seal(entry)) + "\n").encode())


MAX_MANIFEST = 8 * 1024 * 1024
"""The most bytes an entry's runtime.json may hold (a file list of MAX_FILES files)."""


def _manifest(entry: Path) -> dict[str, Any]:
    """The entry's runtime.json, when the entry's folders are real ones (no links), they, the
    manifest and the seal outside the entry are the runner's user's (:func:`_mine`) and the
    seal matches; ValueError otherwise."""
    for rel in ("", "files", "runtime.json"):
        st = os.lstat(entry / rel if rel else entry)
        if rel != "runtime.json" and not stat.S_ISDIR(st.st_mode):
            raise ValueError(f"{entry / rel} is not a folder (a link?)")
        if not _mine(st):
            raise ValueError(f"{entry / rel} is not the runner's (another user made it)")
    with safefs.open_under(entry.parent, _seal_path(entry).name) as f:
        if not _mine(os.fstat(f.fileno())):
            raise ValueError(f"{_seal_path(entry)} is not the runner's (another user made it)")
        seal = json.loads(f.read(64 * 1024))
    if seal != json.loads(json.dumps(_seal(entry))):
        raise ValueError("the entry is not as sealed when it was made")
    with safefs.open_under(entry, "runtime.json") as f:
        raw = f.read(MAX_MANIFEST + 1)
    if len(raw) > MAX_MANIFEST:
        raise ValueError("runtime.json is too large")
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("runtime.json is not an object")
    return data


def _unchanged(st: os.stat_result, f: Mapping[str, Any]) -> bool:
    return (
        stat.S_ISREG(st.st_mode)
        and _mine(st)
        and st.st_size == int(f["size"])
        and _stamp(st) == {k: int(f[k]) for k in ("dev", "inode", "mtimeNs", "ctimeNs")}
        and st.st_mode & 0o7777 == (0o555 if f["executable"] else 0o444)
    )


def _load(entry: Path, image_id: str, paths: tuple[str, ...]) -> Runtime | None:
    """The cached entry, when it is whole and unchanged since it was hashed; else None."""
    try:
        data = _manifest(entry)
        if data.get("imageId") != image_id or tuple(data.get("paths") or ()) != paths:
            return None
        want = {str(f["path"]): f for f in data["files"]}
        seen = 0
        for rel, st in _walk_files(entry / "files"):
            f = want.get(rel)
            if f is None or not _unchanged(st, f):
                return None
            seen += 1
        if seen != len(want):
            return None
        files = tuple(
            RuntimeFile(str(f["path"]), str(f["sha256"]), int(f["size"]), bool(f["executable"]))
            for f in data["files"]
        )
    except (OSError, ValueError, KeyError, TypeError, safefs.UnsafePath):
        return None
    return Runtime(image_id, paths, entry / "files", files, _files_digest(files), False)


# --------------------------------------------------------------------------- an attempt's


UNSET = {"LD_PRELOAD": "", "LD_AUDIT": ""}
"""Variables of the contract's image that would load code into the runtime before its own
(a preload library, an audit module): set empty in the container (the adapter's env may set
them). Only the image's ENV is undone: its loader, libc and /bin/sh stay the image's."""


@dataclass(frozen=True)
class Brought:
    """The runtime brought into an attempt's container: its files, its image, its env."""

    runtime: Runtime
    image: ImageRecord
    """The runtime's image, as acquired and verified."""
    carried: dict[str, str]
    """The runtime image's configured variables the contract's image does not set."""
    path: str
    """PATH: the adapter's, else /opt/runner-agent then the contract image's own, verbatim."""

    def apply(self, spec: ContainerSpec, adapter_env: Mapping[str, str]) -> ContainerSpec:
        """``spec`` with the runtime mounted read-only and its environment (the runner's own
        variables and the adapter's win over the runtime image's; PATH is the adapter's if
        it names one)."""
        recheck(self.runtime)
        env = {
            **self.carried,
            **UNSET,
            **spec.environment,
            "PATH": adapter_env.get("PATH", self.path),
        }
        mount = Mount(self.runtime.folder, MOUNT, read_only=True)
        labels = {**spec.labels, IN_USE_LABEL: self.runtime.folder.parent.name}
        return dataclasses.replace(
            spec, environment=env, mounts=[*spec.mounts, mount], labels=labels
        )

    def record(self) -> dict[str, Any]:
        return {"image": self.image.model_dump(mode="json"), **self.runtime.record()}


def bring(
    backend: Backend,
    plan: ExecutionPlan,
    contract_image: ImageInfo,
    acquire: Callable[[ImagePin], tuple[Acquired, ImageRecord]],
    state_root: Path,
    labels: Mapping[str, str],
) -> Brought | None:
    """The agent runtime of ``plan``, brought into the contract's image: its image acquired
    and verified as any pinned image, its files from the cache (extracted now if not there),
    its fit to the contract's image checked. None when the plan runs no agent there."""
    agent = plan.agent
    if agent is None or plan.agent_image is None:
        return None
    got, record = acquire(plan.agent_image)
    root = cache_root(state_root)
    runtime = ensure(backend, got.info.id, agent.adapter.runtimePaths, root, labels)
    try:
        return _fitted(backend, plan, contract_image, got, record, runtime, state_root, labels)
    except BaseException:  # not brought: the entry is not held for this attempt
        release(runtime)
        raise


def _fitted(
    backend: Backend,
    plan: ExecutionPlan,
    contract_image: ImageInfo,
    got: Acquired,
    record: ImageRecord,
    runtime: Runtime,
    state_root: Path,
    labels: Mapping[str, str],
) -> Brought:
    """The runtime, once its fit to the contract's image is known (checked now, or found
    before for the same pair), with its PATH and the runtime image's variables."""
    agent = plan.agent
    assert agent is not None  # noqa: S101 - bring() only calls it for an agent
    requires = agent.adapter.runtimeRequires
    argv = plan.argv  # the first word is every attempt's (the limits left come later)
    # Images are immutable by id: a fit found once holds for the same pair (and argv's
    # first word and requirements), so only the first attempt of a pair asks the engine.
    key = json.dumps(
        [
            FIT_CHECK,
            contract_image.id,
            runtime.digest,
            argv[:1],
            sorted(requires),
            agent.adapter.env.get("PATH"),
        ],
        separators=(",", ":"),
    )
    fit = fits_root(state_root) / hashlib.sha256(key.encode()).hexdigest()
    path = agent.adapter.env.get("PATH") or ":".join([MOUNT, image_path(contract_image)])
    if not _fit_known(fit, key):
        check_fits(
            backend, contract_image, plan.image.reference, runtime, argv, requires, labels, path
        )
        fit.parent.mkdir(parents=True, exist_ok=True)
        _write_new(fit, (key + "\n").encode())
    own = {e.partition("=")[0] for e in contract_image.env}
    carried = {}
    for item in got.info.env:
        key, sep, value = item.partition("=")
        if sep and key not in own and key not in {"PATH", "HOME"} and not key.startswith("RUNNER_"):
            carried[key] = value
    return Brought(runtime, record, carried, path)


def _fit_known(fit: Path, key: str) -> bool:
    """Whether the fit file says this pair fits: a regular file (no link followed) the
    runner's user wrote, holding the pair's key. A file merely there (an empty one, another
    user's) is not believed: the check is made again."""
    try:
        with safefs.open_under(fit.parent, fit.name) as f:
            if not _mine(os.fstat(f.fileno())):
                return False
            return f.read(len(key) + 2) == (key + "\n").encode()
    except (OSError, safefs.UnsafePath):
        return False


def describe(brought: Brought) -> str:
    """For the progress output: where the agent's commands run, and its runtime's files."""
    runtime = brought.runtime
    how = f"copied out in {runtime.seconds:.1f} s" if runtime.extracted else "cached"
    size = sum(f.size for f in runtime.files)
    return (
        f"{len(runtime.files)} runtime file(s) ({size:,} bytes, {how}) from "
        f"{brought.image.id} at {MOUNT}, read-only"
    )


def verify(
    state_root: Path, *, remove: bool, in_use: Callable[[str], list[str]] | None = None
) -> tuple[int, dict[str, str]]:
    """Re-hash every file of every cached runtime against its runtime.json (an attempt checks
    only the files' stamps, sizes and modes): (entries checked, {entry: problem} of those
    that are not what was extracted), each removed with ``remove`` (the next attempt
    extracts it again) unless a container still mounts it (``in_use``: the containers that
    do, by entry name; None: the engine could not be asked, so nothing is removed)."""
    root = cache_root(state_root)
    bad: dict[str, str] = {}
    names = _entries(root)
    for name in names:
        entry = root / name
        with locks.flocked(root / f".{name}.lock"):
            problem = _problem(entry)
            if problem is None:
                continue
            holders = in_use(name) if in_use is not None else None
            if holders == [] and _busy(root, name):
                holders = ["a runner about to mount it"]
            if remove and holders == []:
                archives.remove_tree(entry)
            elif remove:
                why = f"in use by {', '.join(holders)}" if holders else "the engine was not asked"
                problem += f" (kept: {why})"
            bad[name] = problem
    return len(names), bad


def _entries(root: Path) -> list[str]:
    try:
        return sorted(
            e.name
            for e in os.scandir(root)
            if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)
        )
    except FileNotFoundError:
        return []


@dataclass(frozen=True)
class Pruned:
    removed: list[str]
    kept_in_use: dict[str, list[str]]
    freed_bytes: int


def prune(
    state_root: Path, *, older_than: float | None, in_use: Callable[[str], list[str]]
) -> Pruned:
    """Remove the cached runtimes not used for ``older_than`` seconds (None: any), except
    those a container still mounts; an entry a runner is extracting or checking (its lock
    held) is left for the next prune."""
    root = cache_root(state_root)
    now = time.time()
    removed, kept, freed = [], {}, 0
    for name in _entries(root):
        if older_than is not None and now - _used(root, name) < older_than:
            continue
        with locks.flocked(root / f".{name}.lock"):
            # Read again under the lock: a runner may have used it since (ensure marks it
            # used under this lock), and it is mounted only after its inputs are staged.
            if not os.path.lexists(root / name):
                continue  # another prune's
            if older_than is not None and now - _used(root, name) < older_than:
                continue
            holders = in_use(name) or (["a runner about to mount it"] if _busy(root, name) else [])
            if holders:
                kept[name] = holders
                continue
            size = sum(st.st_size for _, st in _walk_files(root / name))
            archives.remove_tree(root / name)
            for tail in (".used", ".seal", ".inuse"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(root / f".{name}{tail}")
        removed.append(name)
        freed += size
    return Pruned(removed, kept, freed)


def _used(root: Path, name: str) -> float:
    try:
        return os.lstat(root / f".{name}.used").st_mtime
    except FileNotFoundError:
        return os.lstat(root / name).st_mtime


def _problem(entry: Path) -> str | None:
    try:
        data = _manifest(entry)
        want = {str(f["path"]): f for f in data["files"]}
        have = {rel: st for rel, st in _walk_files(entry / "files")}
    except (OSError, ValueError, KeyError, TypeError, safefs.UnsafePath) as exc:
        return f"unreadable: {exc}"
    if set(have) != set(want):
        odd = sorted(set(have) ^ set(want))
        return f"its files are not those extracted ({', '.join(odd[:3])})"
    for rel, st in sorted(have.items()):
        if not stat.S_ISREG(st.st_mode):
            return f"{rel} is not a regular file"
        if not _mine(st):
            return f"{rel} is not the runner's (another user made it)"
        if st.st_mode & 0o7777 != (0o555 if want[rel]["executable"] else 0o444):
            return f"{rel} has mode {st.st_mode & 0o7777:o}, not as extracted"
        digest = hashlib.sha256()
        with safefs.open_under(entry / "files", rel) as f:
            while chunk := f.read(1024 * 1024):
                digest.update(chunk)
        if "sha256:" + digest.hexdigest() != want[rel]["sha256"]:
            return f"{rel} changed since it was extracted"
    return None
