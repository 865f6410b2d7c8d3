"""The job directory: where a job's inputs, outputs and records live on the host.

Layout of ``<state>/jobs/<job id>/``::

    input/          the contract's inputs (paper, repository), task.json, parser-catalog.json,
                    result.schema.json, compute-decision.json; mounted read-only
    output/         the job's evidence, stdout and stderr; mounted read-write
    workspace/      the job's working copy of the repository and its scratch; read-write
    runtime-cache/  caches the job keeps across its attempts; read-write
    runtime-venv/   the job's own Python environment, kept across attempts; read-write
    assets/         datasets and checkpoints; mounted read-only
    execution/      runner-owned files the job may read (runtime-budget.json, input-manifest.json);
                    mounted read-only
    record/         runner-owned, never mounted: the ledger, the lock, earlier envelopes and
                    attempts/<n>/ (each attempt's container state, engine log, output manifest
                    and, once a later attempt starts, its stdout and stderr)
    result.json     the result envelope, written last and atomically
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from runner import safefs
from runner.contract import VerifiedContract
from runner.errors import ContractError, JobBusy, PolicyViolation
from runner.ledger import Budget

CHUNK = 1024 * 1024


@dataclass(frozen=True)
class JobDir:
    root: Path

    @property
    def input(self) -> Path:
        return self.root / "input"

    @property
    def output(self) -> Path:
        return self.root / "output"

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def execution(self) -> Path:
        return self.root / "execution"

    @property
    def runtime_cache(self) -> Path:
        return self.root / "runtime-cache"

    @property
    def runtime_venv(self) -> Path:
        return self.root / "runtime-venv"

    @property
    def assets(self) -> Path:
        return self.root / "assets"

    @property
    def writable(self) -> tuple[Path, ...]:
        """The folders the job writes, all counted in its disk quota."""
        return (self.output, self.workspace, self.runtime_cache, self.runtime_venv)

    def attempt_record(self, n: int) -> Path:
        """``record/attempts/<n>/``: what the runner kept of attempt ``n``."""
        return self.record / "attempts" / str(n)

    @property
    def record(self) -> Path:
        return self.root / "record"

    @property
    def envelope(self) -> Path:
        return self.root / "result.json"

    @property
    def budget_file(self) -> Path:
        """``execution/runtime-budget.json``: what the job reads of its budget."""
        return self.execution / "runtime-budget.json"

    def write_budget(self, budget: Budget) -> None:
        """Write runtime-budget.json (atomically; the job reads it read-only)."""
        write_json(self.budget_file, {"schemaVersion": "1.0", **budget.as_json()})

    @property
    def ledger(self) -> Path:
        """``record/ledger.jsonl``: the job's budget ledger."""
        return self.record / "ledger.jsonl"

    @property
    def lock(self) -> Path:
        """``record/lock``: held (``flock``) by the one runner running the job."""
        return self.record / "lock"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One runner per job directory at a time: a second is refused, never run beside it."""
        handle = self.lock.open("a+")
        try:
            # Onlookers (runner cleanup, the GPU allocator) probe the lock for an instant:
            # wait out such a probe rather than mistake it for another runner.
            for _ in range(20):
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    time.sleep(0.1)
            else:
                raise JobBusy(
                    f"job {self.root.name} is being run by another runner on this host right now",
                    hint="wait for it to finish, or give this run another --job-id",
                )
            yield
        finally:
            handle.close()


@dataclass(frozen=True)
class StateDir:
    """The runner's state folder: ``jobs/<job id>/`` and ``gpu-locks/``."""

    root: Path

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    def job(self, job_id: str) -> JobDir:
        return JobDir(self.jobs / job_id)

    @property
    def gpu_locks(self) -> Path:
        return self.root / "gpu-locks"


@dataclass(frozen=True)
class StagedFile:
    path: str
    sha256: str
    size: int


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, value: Any) -> None:
    atomic_write(path, (json.dumps(value, indent=2, sort_keys=False) + "\n").encode())


@dataclass(frozen=True)
class InputRules:
    """What the host lets a contract stage (the policy's ``maxInputMb``, ``maxInputFiles``) and
    what it never stages: the runner's own folders (config with its keys, state), as
    ``(st_dev, st_ino)`` of each."""

    max_bytes: int = 64 * 1024**3
    max_files: int = 100_000
    protected: frozenset[tuple[int, int]] = frozenset()

    @staticmethod
    def protecting(paths: list[Path], **caps: int) -> InputRules:
        ids = set()
        for path in paths:
            try:
                st = path.stat()
            except OSError:
                continue
            ids.add((st.st_dev, st.st_ino))
        return InputRules(protected=frozenset(ids), **caps)


@dataclass
class _Tally:
    rules: InputRules
    field: str
    files: int = 0
    bytes: int = 0

    def refuse(self, rel: str, problem: str, hint: str) -> ContractError:
        return ContractError(f"{rel} {problem}", path=self.field, hint=hint)

    def over(self, rel: str, problem: str, hint: str) -> PolicyViolation:
        return PolicyViolation(f"{self.field}: {rel} {problem}", hint=hint)

    def visit(self, rel: str, st: os.stat_result) -> None:
        """Count one entry; refuse the runner's own folders, links and special files."""
        if (st.st_dev, st.st_ino) in self.rules.protected:
            raise self.refuse(
                rel,
                "is one of the runner's own folders (its configuration and keys, or its state); "
                "it is never staged into a job",
                "name the paper or repository itself, not a folder that holds the runner's",
            )
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise self.refuse(
                rel,
                f"is {safefs.kind(st.st_mode)}; inputs are copied as plain files and folders",
                "replace it with the file it stands for, or remove it",
            )
        self.files += 1
        if self.files > self.rules.max_files:
            raise self.over(
                rel,
                f"is entry {self.files:,} of the inputs; this host stages at most "
                f"{self.rules.max_files:,} files and folders",
                "pack the inputs (a tar file), or raise maxInputFiles in the host policy",
            )

    def take(self, rel: str, size: int) -> None:
        self.bytes += size
        if self.bytes > self.rules.max_bytes:
            raise self.over(
                rel,
                f"brings the inputs to {self.bytes:,} bytes; this host stages at most "
                f"{self.rules.max_bytes:,} bytes",
                "stage less (datasets belong in assets), or raise maxInputMb in the host policy",
            )


_ZEROS = bytes(CHUNK)


def _copy_fd(fd: int, dst: Path, rel: str, tally: _Tally) -> StagedFile:
    """Copy and hash the open regular file ``fd``; runs of zeros stay holes (sparse files stay
    sparse); never more than the size the file had when opened, nor past the inputs' cap."""
    st = os.fstat(fd)
    tally.take(rel, st.st_size)
    digest = hashlib.sha256()
    left = st.st_size
    with os.fdopen(fd, "rb") as fin, dst.open("wb") as fout:
        while left > 0 and (chunk := fin.read(min(CHUNK, left))):
            digest.update(chunk)
            left -= len(chunk)
            if chunk == _ZEROS[: len(chunk)]:
                fout.seek(len(chunk), os.SEEK_CUR)
            else:
                fout.write(chunk)
        size = st.st_size - left
        fout.truncate(size)
    os.chmod(dst, 0o755 if st.st_mode & stat.S_IXUSR else 0o644)
    return StagedFile(rel, digest.hexdigest(), size)


def _stage_dir(fd: int, target: Path, rel: str, tally: _Tally) -> list[StagedFile]:
    """Copy the folder open as ``fd`` (closed here) to ``target``, walking by descriptors:
    nothing below it is reached through a link."""
    out: list[StagedFile] = []
    stack = [(fd, target, rel)]
    try:
        while stack:
            here_fd, here, here_rel = stack.pop()
            try:
                here.mkdir(parents=True, exist_ok=True)
                with os.scandir(here_fd) as listing:
                    entries = sorted(listing, key=lambda e: e.name)
                for entry in entries:
                    sub = f"{here_rel}/{entry.name}"
                    st = entry.stat(follow_symlinks=False)
                    tally.visit(sub, st)
                    if stat.S_ISDIR(st.st_mode):
                        child = safefs.open_folder_at(here_fd, entry.name, sub)
                        stack.append((child, here / entry.name, sub))
                    else:
                        file_fd = safefs.open_at(here_fd, entry.name, sub)
                        out.append(_copy_fd(file_fd, here / entry.name, sub, tally))
            finally:
                os.close(here_fd)
    except safefs.UnsafePath as exc:
        raise tally.refuse(exc.rel, exc.problem, "inputs are plain files and folders") from None
    finally:
        for left_fd, _, _ in stack:
            os.close(left_fd)
    return out


def _stage_tree(base: Path, rel: str, dst_root: Path, tally: _Tally) -> list[StagedFile]:
    """Copy ``base/rel`` (a file or a folder) to ``dst_root/rel``, hashing every file: no
    link is followed anywhere below ``base``, and only regular files and folders are read."""
    try:
        with safefs.parent_fd(base, rel, on_folder=tally.visit) as (parent, name):
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                raise tally.refuse(
                    f"{base / rel}", "does not exist", "fix the path or add the file"
                ) from None
            tally.visit(rel, st)
            target = dst_root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if stat.S_ISDIR(st.st_mode):
                folder = safefs.open_folder_at(parent, name, rel)
                return _stage_dir(folder, target, rel, tally)
            return [_copy_fd(safefs.open_at(parent, name, rel), target, rel, tally)]
    except safefs.UnsafePath as exc:
        hint = (
            "fix the path or add the file"
            if exc.missing
            else "replace each link on the way with the file or folder it points to"
        )
        raise tally.refuse(f"{base / exc.rel}", exc.problem, hint) from None
    except OSError as exc:  # unreadable, or changed while staged: the contract's inputs
        where = f"{base / rel}" + (f" ({exc.filename})" if exc.filename else "")
        raise tally.refuse(where, f"cannot be staged: {exc.strerror or exc}", "check it") from exc


def _refuse_inside_protected(base: Path, rules: InputRules) -> None:
    """A contract kept inside the runner's own folders stages nothing from there."""
    for folder in (base.resolve(), *base.resolve().parents):
        try:
            st = folder.stat()
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in rules.protected:
            raise ContractError(
                f"the contract's folder {base} is inside the runner's own folder {folder} "
                "(its configuration and keys, or its state); nothing is staged from there",
                hint="keep contracts and their inputs in a folder of their own",
            )


def _normalized(rel: str) -> str:
    return os.path.normpath(rel)


def prepare(root: Path) -> JobDir:
    """Create the job directory's folders (idempotent)."""
    job = JobDir(root)
    for folder in (job.input, job.execution, job.record, job.assets, *job.writable):
        folder.mkdir(parents=True, exist_ok=True)
    return job


def stage_inputs(
    job: JobDir, contract: VerifiedContract, rules: InputRules | None = None
) -> list[StagedFile]:
    """Copy the contract's inputs into ``input/`` (replacing what was there), hash them, and
    place the verified contract bytes at ``input/task.json``. Returns the input manifest.

    Inputs are walked without following any link (:mod:`runner.safefs`), special files are
    refused, and ``rules`` caps their count and size and names folders never staged."""
    rules = rules or InputRules()
    _refuse_inside_protected(contract.base_dir, rules)
    if job.input.exists():
        shutil.rmtree(job.input)
    job.input.mkdir()
    files: list[StagedFile] = []
    sources = [
        ("$.paper.path", contract.model.paper.path if contract.model.paper else None),
        (
            "$.repository.path",
            contract.model.repository.path if contract.model.repository else None,
        ),
        ("$.agent.promptPath", contract.model.agent.promptPath if contract.model.agent else None),
    ]
    tally = _Tally(rules, "")
    staged: list[str] = []
    for field, rel in sources:
        if rel is None:
            continue
        rel = _normalized(rel)
        if rel in {".", "task.json"}:
            raise ContractError(
                f"{rel!r} would overwrite the input folder or task.json",
                path=field,
                hint="name a file or folder beside the contract",
            )
        if any(rel == d or rel.startswith(d + "/") for d in staged):
            continue  # inside an input staged already (a prompt in the repository, say)
        staged.append(rel)
        tally.field = field
        files.extend(_stage_tree(contract.base_dir, rel, job.input, tally))
    atomic_write(job.input / "task.json", contract.raw)
    from runner.parsers import registry

    catalog = (json.dumps(registry.catalog(), indent=2) + "\n").encode()
    atomic_write(job.input / "parser-catalog.json", catalog)
    files.append(
        StagedFile("parser-catalog.json", hashlib.sha256(catalog).hexdigest(), len(catalog))
    )
    if contract.signature is not None:
        atomic_write(job.input / "task.dsse.json", contract.signature.envelope)
        files.append(
            StagedFile(
                "task.dsse.json",
                hashlib.sha256(contract.signature.envelope).hexdigest(),
                len(contract.signature.envelope),
            )
        )
    files.append(
        StagedFile("task.json", hashlib.sha256(contract.raw).hexdigest(), len(contract.raw))
    )
    files.sort(key=lambda f: f.path)
    write_json(
        job.execution / "input-manifest.json",
        {
            "schemaVersion": "1.0",
            "files": [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in files],
        },
    )
    return files


def prepare_writable(job: JobDir, uid: int, gid: int, stream_paths: list[str]) -> None:
    """Make ``output/`` and ``workspace/`` writable by the job's user; pre-create the folders
    of its stdout and stderr files."""
    for rel in stream_paths:
        folder = os.path.dirname(rel)
        # Never through a link an earlier attempt left in output/: that is the job's own
        # doing, and its log then cannot be written, which it will see.
        if folder:
            with contextlib.suppress(safefs.UnsafePath):
                safefs.makedirs_under(job.output, folder)
    if os.geteuid() != 0:
        return  # the job runs as the caller's own uid, which owns these folders already
    for base in job.writable:
        for dirpath, dirnames, filenames in os.walk(base):
            os.chown(dirpath, uid, gid)
            for name in [*dirnames, *filenames]:
                os.chown(Path(dirpath) / name, uid, gid, follow_symlinks=False)


def _sha256_stream(f: BinaryIO, limit: int) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    while size < limit and (chunk := f.read(min(CHUNK, limit - size))):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def sha256_under(base: Path, rel: str, max_bytes: int) -> tuple[str | None, int]:
    """Hex sha256 and size of ``base/rel``, a file a job or a contract author controls: a
    regular file reached without following any link (:mod:`runner.safefs`). A file over
    ``max_bytes`` is not read: ``(None, its size)``. Raises :class:`safefs.UnsafePath`."""
    with safefs.open_under(base, rel) as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            return None, size
        return _sha256_stream(f, size)


def job_file_problem(exc: safefs.UnsafePath) -> str:
    """Why a job's file was not read, for an envelope: links are never followed."""
    if exc.missing:
        return "does not exist"
    return (
        f"{exc.problem}; it was not read (the runner follows no link in a job's files, so "
        "nothing outside /job/output is ever read)"
    )
