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

from runner.agents import adapters as agents
from runner.contract import VerifiedContract
from runner.core import archives, safefs
from runner.core.errors import InputDigestMismatch, PolicyViolation
from runner.execution import quotas
from runner.models import selfreport
from runner.planning.plan import ExecutionPlan
from runner.staging import inputs
from runner.staging import jobdir as staging
from runner.staging.jobdir import StagedFile, record_added_input
from runner.state.jobdir import JobDir, atomic_write, write_json

__all__ = ["add_input", "own_inputs", "working_copy"]


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
    try:
        staged, _named = staging.staged_tree(job)
    except ValueError as exc:
        raise InputDigestMismatch(
            f"$.repository.path: the working copy cannot be checked against what was staged: {exc}",
            hint="stage the job again (`runner run --rerun`, or a new job folder)",
        ) from None
    tmp = job.workspace / ".repository.staging"
    _remove(tmp)  # left by a runner that died while copying
    try:
        used = quotas.allocated_bytes(list(job.writable))
    except quotas.Unmeasured:  # what an earlier attempt left cannot be counted: no room
        used = disk_quota + 1
    room = _Room(disk_quota - used, disk_quota)
    room.expect(job.input, tmp, staged)
    try:
        shutil.copytree(source, tmp, symlinks=True, copy_function=room.copy)
        room.check(os.path.normpath(repo))
    except BaseException:
        _remove(tmp)
        raise
    os.replace(tmp, target)
    return True


def _remove(path: Path) -> None:
    """The working copy an earlier attempt left (the job's to shape: a tree a thousand deep
    raised RecursionError in shutil.rmtree, and every retry's staging with it)."""
    archives.remove_tree(path)


class _Room:
    """What the working copy may still take of the job's disk quota, counted as it is written
    (each file's allocated blocks once written; each chunk before it is written)."""

    def __init__(self, left: int, quota: int) -> None:
        self.left, self.quota, self.file = left, quota, 0
        self.staged: dict[str, inputs.Entry] = {}
        self.copied: set[str] = set()
        self.input, self.tmp = Path(), Path()

    def expect(self, input_dir: Path, tmp: Path, staged: dict[str, inputs.Entry]) -> None:
        """Each file copied from ``input_dir`` (to below ``tmp``) must hash to its entry in
        ``staged`` (``record/input-tree.json``): the input cache's files are linked into
        ``input/`` and could be changed after the stamp check, before the copy."""
        self.input, self.tmp, self.staged = input_dir, tmp, staged

    def _mismatch(self, rel: str, what: str) -> InputDigestMismatch:
        return InputDigestMismatch(
            f"$.repository.path: input/{rel} {what} while the job's working copy was made: "
            "the job would run other code than the contract binds, so nothing ran",
            hint="an input (or the input cache entry it came from) was changed on this host; "
            "find who writes there, then run again (a changed cache entry is re-hashed)",
        )

    def check(self, repo: str) -> None:
        """Every file and link staged below ``input/<repo>`` is in the copy, as staged."""
        for path, entry in self.staged.items():
            if not path.startswith(repo + "/") or entry.kind == "D":
                continue
            rel = path[len(repo) + 1 :]
            if entry.kind == "L":
                try:
                    target = os.readlink(self.tmp / rel)
                except OSError:
                    raise self._mismatch(path, "(a link) was gone") from None
                if hashlib.sha256(os.fsencode(target)).hexdigest() != entry.sha256:
                    raise self._mismatch(path, "(a link) was retargeted")
            elif path not in self.copied:
                raise self._mismatch(path, "was gone")
        for dirpath, dirnames, filenames in os.walk(self.tmp):  # a link added: not staged
            for name in [*dirnames, *filenames]:
                rel = f"{repo}/{os.path.relpath(os.path.join(dirpath, name), self.tmp)}"
                staged = self.staged.get(rel.replace(os.sep, "/"))
                linked = os.path.islink(os.path.join(dirpath, name))
                if linked and (staged is None or staged.kind != "L"):
                    raise self._mismatch(rel, "(a link) was not staged (added)")

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
                rel = os.path.relpath(src, self.input).replace(os.sep, "/")
                entry = self.staged.get(rel)
                if entry is None or entry.kind not in ("F", "X"):
                    raise self._mismatch(rel, "was not staged (added)")
                self.file = 0
                digest = hashlib.sha256()
                copied = safefs.copy_sparse(fd, out, st.st_size, digest, on_write=self._take)
                if copied != st.st_size or digest.hexdigest() != entry.sha256:
                    raise self._mismatch(rel, "differed from what was staged (changed)")
                self.copied.add(rel)
                os.fchmod(out, 0o755 if executable else 0o644)
                self.file = 0
                self._take(os.fstat(out).st_blocks * 512)  # what it really takes
                self.left -= self.file
            finally:
                os.close(out)


def own_inputs(p: ExecutionPlan) -> list[tuple[str, bytes]]:
    """The runner's files staged into ``input/`` with the contract's inputs (name, bytes):
    the self-report's schema, and an agent's host prompt when the contract names none."""
    own = [("result.schema.json", selfreport.schema_bytes())]
    prompt = agents.prompt_bytes(p.agent) if p.agent is not None else None
    if prompt is not None:
        own.append((agents.HOST_PROMPT_NAME, prompt))
    return own


def add_input(job: JobDir, name: str, data: bytes) -> StagedFile:
    """Place a runner-written file in ``input/`` once the inputs are staged (the compute
    decision, the last thing written before the attempt starts) and add it to the input
    manifest and the listing, each fsynced: their last writes before the attempt. The
    runner's files known at staging are staged with the inputs instead
    (:func:`runner.staging.jobdir.stage_inputs`' ``extra``)."""
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
