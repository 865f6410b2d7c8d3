"""The ``/job`` layout beyond the staged inputs: the job's working copy of the repository and
the files the runner writes for it into ``input/`` (``result.schema.json``,
``compute-decision.json``), each added to the input manifest."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat

from runner.contract import VerifiedContract
from runner.staging import JobDir, StagedFile, atomic_write, record_added_input, write_json


def working_copy(job: JobDir, contract: VerifiedContract) -> bool:
    """Give the job a writable copy of the staged repository at ``workspace/repository``
    (the pristine one stays read-only in ``input/``). Made once, from the staged copy (links
    stay links, files are copied: never hard-linked, as the staged ones may be the input
    cache's), and kept across attempts with the job's edits; True when made now."""
    repo = contract.model.repository.path if contract.model.repository else None
    target = job.workspace / "repository"
    if repo is None or os.path.lexists(target):
        return False
    source = job.input / os.path.normpath(repo)
    if not source.is_dir() or source.is_symlink():
        return False
    tmp = job.workspace / ".repository.staging"
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp)  # left by a runner that died while copying
    elif os.path.lexists(tmp):
        tmp.unlink()
    shutil.copytree(source, tmp, symlinks=True, copy_function=_writable_copy)
    os.replace(tmp, target)
    return True


def _writable_copy(src: str, dst: str) -> None:
    """A new file with the bytes of ``src`` (never a link to it: staged files may be the input
    cache's, :mod:`runner.inputcache`), writable by its owner whatever the staged mode (0444
    when cached); executable when ``src`` is."""
    shutil.copyfile(src, dst, follow_symlinks=False)
    executable = os.stat(src, follow_symlinks=False).st_mode & stat.S_IXUSR
    os.chmod(dst, 0o755 if executable else 0o644)


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
