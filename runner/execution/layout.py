"""The ``/job`` layout beyond the staged inputs: the job's working copy of the repository and
the files the runner writes for it into ``input/`` (``result.schema.json``,
``compute-decision.json``), each added to the input manifest."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

from runner.contract import VerifiedContract
from runner.core import safefs
from runner.core.errors import PolicyViolation
from runner.execution import quotas
from runner.staging.jobdir import JobDir, StagedFile, atomic_write, record_added_input, write_json


def working_copy(job: JobDir, contract: VerifiedContract, disk_quota: int) -> bool:
    """Give the job a writable copy of the staged repository at ``workspace/repository``
    (the pristine one stays read-only in ``input/``). Made once, from the staged copy (links
    stay links, files are copied: never hard-linked, as the staged ones may be the input
    cache's; holes stay holes), and kept across attempts with the job's edits; True when made
    now. The copy counts against the job's disk quota (``workspace/`` is measured with
    ``output/``, by allocated blocks): a copy that would take more than what the quota leaves
    is stopped before it writes past it, removed, and refused (:class:`PolicyViolation`)."""
    repo = contract.model.repository.path if contract.model.repository else None
    target = job.workspace / "repository"
    if repo is None or os.path.lexists(target):
        return False
    source = job.input / os.path.normpath(repo)
    if not source.is_dir() or source.is_symlink():
        return False
    tmp = job.workspace / ".repository.staging"
    _remove(tmp)  # left by a runner that died while copying
    room = _Room(disk_quota - quotas.allocated_bytes(list(job.writable)), disk_quota)
    try:
        shutil.copytree(source, tmp, symlinks=True, copy_function=room.copy)
    except BaseException:
        _remove(tmp)
        raise
    os.replace(tmp, target)
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


class _Room:
    """What the working copy may still take of the job's disk quota, counted as it is written
    (each file's allocated blocks once written; each chunk before it is written)."""

    def __init__(self, left: int, quota: int) -> None:
        self.left, self.quota, self.file = left, quota, 0

    def _take(self, n: int) -> None:
        self.file += n
        if self.file > self.left:
            raise PolicyViolation(
                f"$.repository.path: the job's working copy of the repository "
                f"(workspace/repository) takes more than the {max(self.left, 0):,} bytes its "
                f"disk quota ({self.quota:,} bytes, output/ and workspace/ together) leaves; "
                "it was stopped before writing past it and removed",
                hint="raise environment.diskGb in the contract (within the host's maximum), "
                "or stage a smaller repository (data belongs in assets)",
            )

    def copy(self, src: str, dst: str) -> None:
        """A new file with the bytes of ``src`` (never a link to it: staged files may be the
        input cache's, :mod:`runner.caches.inputcache`), holes kept, writable by its owner whatever
        the staged mode (0444 when cached); executable when ``src`` is."""
        with safefs.open_regular(Path(src)) as f:  # a regular file, never a link or a FIFO
            fd = f.fileno()
            st = os.fstat(fd)
            executable = st.st_mode & stat.S_IXUSR
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            out = os.open(dst, flags, 0o755 if executable else 0o644)
            try:
                self.file = 0
                safefs.copy_sparse(fd, out, st.st_size, on_write=self._take)
                os.fchmod(out, 0o755 if executable else 0o644)
                self.file = 0
                self._take(os.fstat(out).st_blocks * 512)  # what it really takes
                self.left -= self.file
            finally:
                os.close(out)


def add_input(job: JobDir, name: str, data: bytes) -> StagedFile:
    """Place a runner-written file in ``input/`` and add it to the input manifest."""
    atomic_write(job.input / name, data)
    record_added_input(job, name, data)
    entry = StagedFile(name, hashlib.sha256(data).hexdigest(), len(data))
    manifest_path = job.execution / "input-manifest.json"
    manifest = json.loads(manifest_path.read_bytes())
    files = [f for f in manifest["files"] if f["path"] != name]
    files.append({"path": name, "sha256": entry.sha256, "size": entry.size})
    manifest["files"] = sorted(files, key=lambda f: str(f["path"]))
    write_json(manifest_path, manifest)
    return entry
