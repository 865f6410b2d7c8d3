"""Long on purpose: staging is one walker over hostile folders (no link followed, links below an
input copied as links, special files refused, caps counted) used three ways — to copy the
inputs into ``input/``, to hash them for the issuer (:func:`hash_input`), and to re-check
``input/`` after the job (:func:`recheck_inputs`) — and splitting it would mean three walkers
to keep equally careful.

The job folder itself (its layout, :class:`JobDir`, :class:`StateDir`, atomic writes) is
:mod:`runner.state.jobdir`'s.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from runner.contract import VerifiedContract
from runner.core import archives, safefs
from runner.core.errors import ContractError, PolicyViolation, RefusedError
from runner.staging import inputs
from runner.state.jobdir import JobDir, atomic_write, write_json

__all__ = [
    "InputRules",
    "StagedFile",
    "StagedInput",
    "Stager",
    "hash_input",
    "job_file_problem",
    "prepare",
    "prepare_writable",
    "recheck_inputs",
    "record_added_input",
    "sha256_under",
    "stage_inputs",
    "staged_tree",
]

CHUNK = 1024 * 1024


@dataclass(frozen=True)
class StagedFile:
    path: str
    sha256: str
    size: int
    link: bool = False
    """A symbolic link, copied as a link: ``sha256`` and ``size`` are of its target text, which
    the runner never follows."""


@dataclass(frozen=True)
class StagedInput:
    """One input the contract names (``paper.path``, ``repository.path``), as staged."""

    field: str
    """``$.paper.path`` or ``$.repository.path``."""
    path: str
    """Where it lies in ``input/`` (its path from the contract's folder, normalized)."""
    digest: str
    """Its runner-tree-v1 digest (:mod:`runner.staging.inputs`)."""
    entries: dict[str, inputs.Entry] | None
    """A folder's entries by path below it; None for a single file."""
    files: list[StagedFile]
    executable: bool = False
    """A single file its owner may execute."""


@dataclass(frozen=True)
class InputRules:
    """What the host lets a contract stage (the policy's ``maxInputMb``, ``maxInputFiles``) and
    what it never stages: the runner's own folders (config with its keys, state), as
    ``(st_dev, st_ino)`` of each."""

    max_bytes: int = 64 * 1024**3
    max_files: int = 100_000
    protected: frozenset[tuple[int, int]] = frozenset()
    replayed: tuple[int, int] | None = None
    """A replay's (``runner replay``): the ``input/`` folder of the job it replays, the one
    folder inside the runner's own that a contract's folder may be. Only its contract's inputs
    are staged from it, walked as any other (no link followed, and nothing protected inside
    it); it holds what the runner staged for that job and mounted read-only."""

    @staticmethod
    def protecting(paths: list[Path], *, replayed: Path | None = None, **caps: int) -> InputRules:
        ids = set()
        for path in paths:
            try:
                st = path.stat()
            except OSError:
                continue
            ids.add((st.st_dev, st.st_ino))
        source = None
        if replayed is not None:
            with contextlib.suppress(OSError):
                got = replayed.lstat()  # the folder itself, never a link to one
                if stat.S_ISDIR(got.st_mode):
                    source = (got.st_dev, got.st_ino)
        return InputRules(protected=frozenset(ids), replayed=source, **caps)


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

    def visit(self, rel: str, st: os.stat_result, *, link_ok: bool = False) -> None:
        """Count one entry; refuse the runner's own folders, special files, and links unless
        ``link_ok`` (below an input's folder, where they are copied as links)."""
        if (st.st_dev, st.st_ino) in self.rules.protected:
            raise self.refuse(
                rel,
                "is one of the runner's own folders (its configuration and keys, or its state); "
                "it is never staged into a job",
                "name the paper or repository itself, not a folder that holds the runner's",
            )
        kinds_ok = stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)
        if not (kinds_ok or (link_ok and stat.S_ISLNK(st.st_mode))):
            where = "below an input's folder" if link_ok else "as an input"
            raise self.refuse(
                rel,
                f"is {safefs.kind(st.st_mode)}; {where} the runner stages plain files and "
                "folders" + (" and symbolic links (as links)" if link_ok else ""),
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


def _copy_fd(fd: int, dst: Path | None, rel: str, tally: _Tally) -> tuple[StagedFile, bool]:
    """Copy (to ``dst``; None: only read) and hash the open regular file ``fd``, closing it:
    holes stay holes and runs of zeros become holes (:func:`runner.core.safefs.copy_sparse`);
    never more than the size the file had when opened, nor past the inputs' cap. Also
    whether its owner may execute it."""
    with contextlib.ExitStack() as files:
        files.callback(os.close, fd)
        st = os.fstat(fd)
        tally.take(rel, st.st_size)
        executable = bool(st.st_mode & stat.S_IXUSR)
        digest = hashlib.sha256()
        out = None
        if dst is not None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            out = os.open(dst, flags, 0o644)
            files.callback(os.close, out)
        size = safefs.copy_sparse(fd, out, st.st_size, digest)
        if out is not None:
            os.fchmod(out, 0o755 if executable else 0o644)
    return StagedFile(rel, digest.hexdigest(), size), executable


def _copy_link(
    dir_fd: int, name: str, dst: Path | None, rel: str, tally: _Tally
) -> tuple[StagedFile, str]:
    """Copy the symbolic link ``name`` as a link: its target text, verbatim, read from the link
    and never followed. Its manifest entry and the hex SHA-256 of that text."""
    target = safefs.readlink_at(dir_fd, name, rel)
    tally.take(rel, len(target))
    if dst is not None:
        os.symlink(target, os.fsencode(dst))
    sha = hashlib.sha256(target).hexdigest()
    return StagedFile(rel, sha, len(target), link=True), sha


def _stage_dir(
    fd: int, target: Path | None, rel: str, tally: _Tally
) -> tuple[list[StagedFile], dict[str, inputs.Entry]]:
    """Copy the folder open as ``fd`` (closed here) to ``target`` (None: only hash it),
    walking by descriptors: nothing below it is reached through a link, and links below it
    are copied as links. Its files and its runner-tree-v1 entries. Depth first, with a
    descriptor open for each folder on the way down and none for those still to enter (one
    for every subfolder found, as it was, ran out under a limit of 1,024 with a dataset of
    1,000 class folders, and the input was refused)."""
    out: list[StagedFile] = []
    found: dict[str, inputs.Entry] = {}
    # Each folder on the way down: its descriptor, and its subfolders still to enter
    # (name, copy, rel, listing path), the next one last.
    path_down: list[tuple[int, list[tuple[str, Path | None, str, str]]]] = []
    here_fd: int | None = fd
    here, here_rel, below = target, rel, ""
    try:
        while here_fd is not None:
            subfolders: list[tuple[str, Path | None, str, str]] = []
            path_down.append((here_fd, subfolders))
            if here is not None:
                here.mkdir(parents=True, exist_ok=True)
            with os.scandir(here_fd) as listing:
                entries = sorted(listing, key=lambda e: e.name)
            for entry in entries:
                sub, path = f"{here_rel}/{entry.name}", f"{below}{entry.name}"
                problem = inputs.name_problem(entry.name)
                if problem is not None:
                    raise tally.refuse(
                        ascii(sub), problem, "rename it: an input's listing has one entry "
                        "a line, in UTF-8"
                    )  # fmt: skip
                st = entry.stat(follow_symlinks=False)
                tally.visit(sub, st, link_ok=True)
                dst = here / entry.name if here is not None else None
                if stat.S_ISDIR(st.st_mode):
                    subfolders.append((entry.name, dst, sub, path + "/"))
                    found[path] = inputs.Entry("D", path)
                elif stat.S_ISLNK(st.st_mode):
                    staged, sha = _copy_link(here_fd, entry.name, dst, sub, tally)
                    out.append(staged)
                    found[path] = inputs.Entry("L", path, sha)
                else:
                    file_fd = safefs.open_at(here_fd, entry.name, sub)
                    staged, executable = _copy_fd(file_fd, dst, sub, tally)
                    out.append(staged)
                    found[path] = inputs.Entry("X" if executable else "F", path, staged.sha256)
            subfolders.reverse()  # entered in name order
            here_fd = None
            if (down := safefs.next_down(path_down)) is not None:
                parent_fd, (name, here, here_rel, below) = down
                here_fd = safefs.open_folder_at(parent_fd, name, here_rel)
    except safefs.UnsafePath as exc:
        raise tally.refuse(
            exc.rel, exc.problem, "inputs are plain files, folders and links"
        ) from None
    finally:
        for left_fd, _ in path_down:
            os.close(left_fd)
        if here_fd is not None and all(here_fd != held for held, _ in path_down):
            os.close(here_fd)
    return out, found


def _stage_tree(base: Path, rel: str, dst_root: Path | None, tally: _Tally) -> StagedInput:
    """Copy ``base/rel`` (a file or a folder) to ``dst_root/rel`` (None: only hash it), hashing
    every file: no link is followed anywhere below ``base``, links on the way to ``rel`` and
    ``rel`` itself are refused, links below it are copied as links, and only regular files and
    folders are read."""
    try:
        with safefs.parent_fd(base, rel, on_folder=tally.visit) as (parent, name):
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                raise tally.refuse(
                    f"{base / rel}", "does not exist", "fix the path or add the file"
                ) from None
            tally.visit(rel, st)
            target = dst_root / rel if dst_root is not None else None
            if target is not None:
                target.parent.mkdir(parents=True, exist_ok=True)
            if stat.S_ISDIR(st.st_mode):
                folder = safefs.open_folder_at(parent, name, rel)
                files, entries = _stage_dir(folder, target, rel, tally)
                digest = inputs.tree_digest(entries.values())
                return StagedInput(tally.field, rel, digest, entries, files)
            staged, executable = _copy_fd(safefs.open_at(parent, name, rel), target, rel, tally)
            digest = f"sha256:{staged.sha256}"
            return StagedInput(tally.field, rel, digest, None, [staged], executable)
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


def hash_input(base: Path, field: str, rel: str, rules: InputRules | None = None) -> StagedInput:
    """The digest and entries of the input ``base/rel`` (``field`` names it), read as
    staging reads it (no link followed; links below it taken as links) and copied nowhere:
    what the issuer's commands bind into a contract."""
    tally = _Tally(rules or InputRules(), field)
    return _stage_tree(base, _normalized(rel), None, tally)


def _refuse_inside_protected(base: Path, rules: InputRules) -> None:
    """A contract kept inside the runner's own folders stages nothing from there (but for a
    replay's, from the replayed job's ``input/``: :attr:`InputRules.replayed`)."""
    if rules.replayed is not None:
        with contextlib.suppress(OSError):
            st = base.lstat()
            if (st.st_dev, st.st_ino) == rules.replayed:
                return
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


Stager = Callable[[str, str, str | None, Callable[[], StagedInput]], tuple[StagedInput, bool]]
"""Stages one input another way than copying it (:mod:`runner.caches.inputcache`): called with the
input's field, its normalized path, the digest the contract binds (or None) and the way to stage
it by copying (copy and hash into ``input/``); returns the staged input and whether it was placed
without reading its source (then its files and bytes are counted against the caps here)."""


def stage_inputs(
    job: JobDir,
    contract: VerifiedContract,
    rules: InputRules | None = None,
    *,
    via: Stager | None = None,
    extra: Sequence[tuple[str, bytes]] = (),
) -> list[StagedFile]:
    """Copy the contract's inputs into ``input/`` (replacing what was there), hash them, check
    them against the digests (and the git commit) the contract binds, and place the verified
    contract bytes at ``input/task.json``, with ``extra`` (name, bytes): more files the runner
    writes there (result.schema.json, the host's prompt), in the same manifest and listing
    rather than added to them one by one. Returns the input manifest.

    Inputs are walked without following any link (:mod:`runner.core.safefs`), links below an
    input's folder are copied as links, special files are refused, and ``rules`` caps their
    count and size and names folders never staged. An input that is not the one the contract
    binds is refused (:class:`~runner.core.errors.InputDigestMismatch`) before anything else.

    ``via`` (the input cache) may place an input the contract binds by digest from a verified
    copy instead; it is held to the same caps and the same checks."""
    rules = rules or InputRules()
    _refuse_inside_protected(contract.base_dir, rules)
    (job.record / "input-tree.json").unlink(missing_ok=True)  # describes the old input/
    if job.input.exists():
        archives.remove_tree(job.input)  # no link followed, no recursion, read-only or not
    job.input.mkdir()
    files: list[StagedFile] = []
    staged: list[StagedInput] = []
    tally = _Tally(rules, "")
    for field, rel, bound in _named_inputs(contract):
        if rel in {".", *RUNNER_INPUTS}:
            raise ContractError(
                f"{rel!r} would overwrite the input folder or a file the runner writes there "
                f"({', '.join(RUNNER_INPUTS)})",
                path=field,
                hint="name a file or folder beside the contract",
            )
        tally.field = field

        def copy(rel: str = rel) -> StagedInput:
            return _stage_tree(contract.base_dir, rel, job.input, tally)

        if via is None:
            got = copy()
        else:
            got, placed = via(field, rel, bound, copy)
            if placed:
                _charge(tally, got)
        _check_bound(job, contract, got, tally.files)
        staged.append(got)
        files.extend(got.files)
    own: list[tuple[str, bytes]] = [("task.json", contract.raw)]
    from runner.parsers import registry

    own.append(("parser-catalog.json", registry.catalog_json()))
    if contract.signature is not None:
        own.append(("task.dsse.json", contract.signature.envelope))
    for name, _ in extra:
        if name not in RUNNER_INPUTS:  # the names no contract input may take, and no other
            raise ValueError(f"{name!r} is not a name the runner writes into input/")
    own.extend(extra)
    for name, data in own:
        atomic_write(job.input / name, data)
        files.append(StagedFile(name, hashlib.sha256(data).hexdigest(), len(data)))
    files.sort(key=lambda f: f.path)
    write_json(
        job.execution / "input-manifest.json",
        {
            "schemaVersion": "1.0",
            "inputs": [{"field": s.field, "path": s.path, "digest": s.digest} for s in staged],
            "files": [
                {
                    "path": f.path,
                    "sha256": f.sha256,
                    "size": f.size,
                    **({"link": True} if f.link else {}),
                }
                for f in files
            ],
        },
        durable=False,  # superseded: add_input rewrites it (fsynced) before any attempt
    )
    _record_tree(job, staged, own)
    return files


def _charge(tally: _Tally, got: StagedInput) -> None:
    """Count an input placed without a walk against the caps, as the walk would have."""
    for f in got.files:
        tally.files += 1
        tally.take(f.path, f.size)
    folders = sum(1 for e in (got.entries or {}).values() if e.kind == "D")
    tally.files += folders + (1 if got.entries is not None else 0)
    if tally.files > tally.rules.max_files:
        raise tally.over(
            got.path,
            f"brings the inputs to {tally.files:,} entries; this host stages at most "
            f"{tally.rules.max_files:,} files and folders",
            "pack the inputs (a tar file), or raise maxInputFiles in the host policy",
        )


RUNNER_INPUTS = (
    "task.json",
    "task.dsse.json",
    "parser-catalog.json",
    "result.schema.json",
    "compute-decision.json",
    "agent-prompt.md",
)
"""The files the runner itself writes into ``input/``: no contract input may take a name."""


def _named_inputs(contract: VerifiedContract) -> list[tuple[str, str, str | None]]:
    """``(field, normalized path, digest)`` of each input the contract names."""
    m = contract.model
    out = []
    for field, obj in (("$.paper.path", m.paper), ("$.repository.path", m.repository)):
        if obj is not None and obj.path is not None:
            out.append((field, _normalized(obj.path), obj.digest))
    if m.agent is not None and m.agent.promptPath is not None:
        out.append(("$.agent.promptPath", _normalized(m.agent.promptPath), m.agent.promptDigest))
    return out


def _check_bound(job: JobDir, contract: VerifiedContract, got: StagedInput, count: int) -> None:
    """Refuse a staged input that is not the one the contract binds: its digest, and, for a
    repository whose commit is named, the commit's tree."""
    expected = next(d for f, _, d in _named_inputs(contract) if f == got.field)
    if expected is not None and expected != got.digest:
        name = Path(contract.source).name  # the contract file run: task.json, task.dsse.json
        raise inputs.mismatch(
            got.field, got.path, expected, got.digest, got.entries, contract.base_dir, name
        )
    repo = contract.model.repository
    commit = repo.commit if repo is not None and got.field == "$.repository.path" else None
    if got.entries is not None and commit is not None and inputs.looks_like_commit(commit):
        inputs.check_commit(job.input / got.path, got.path, commit, got.entries, max(count, 1))


def _record_tree(job: JobDir, staged: list[StagedInput], own: list[tuple[str, bytes]]) -> None:
    """The runner-tree-v1 listing of the whole of ``input/`` as staged, in ``record/`` (never
    mounted): what :func:`recheck_inputs` compares ``input/`` with after the job."""
    whole: dict[str, inputs.Entry] = {}
    for s in staged:
        parts = s.path.split("/")
        for i in range(1, len(parts)):
            folder = "/".join(parts[:i])
            whole[folder] = inputs.Entry("D", folder)
        if s.entries is None:
            kind: inputs.Kind = "X" if s.executable else "F"
            whole[s.path] = inputs.Entry(kind, s.path, s.files[0].sha256)
        else:
            whole[s.path] = inputs.Entry("D", s.path)
            for e in s.entries.values():
                path = f"{s.path}/{e.path}"
                whole[path] = inputs.Entry(e.kind, path, e.sha256)
    for name, data in own:
        whole[name] = inputs.Entry("F", name, hashlib.sha256(data).hexdigest())
    write_json(
        job.record / INPUT_TREE,
        {
            "schemaVersion": "1.0",
            "format": inputs.FORMAT,
            "inputs": [{"field": s.field, "path": s.path, "digest": s.digest} for s in staged],
            "digest": inputs.tree_digest(whole.values()),
            "listing": inputs.listing(whole.values()),
        },
        durable=False,  # superseded: add_input rewrites it (fsynced) before any attempt
    )


def record_added_input(job: JobDir, name: str, data: bytes) -> None:
    """Add a file the runner wrote into ``input/`` after staging (``compute-decision.json``)
    to the recorded listing, so the check after the job expects it."""
    path = job.record / "input-tree.json"
    try:
        recorded = json.loads(path.read_bytes())
        whole = inputs.parse_listing(recorded["listing"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # nothing recorded (staged by an older runner): nothing to compare later
    whole[name] = inputs.Entry("F", name, hashlib.sha256(data).hexdigest())
    recorded["digest"] = inputs.tree_digest(whole.values())
    recorded["listing"] = inputs.listing(whole.values())
    write_json(path, recorded)


@dataclass(frozen=True)
class InputsCheck:
    """``input/`` after the job, against what was staged."""

    inputs: list[dict[str, str]]
    """``{field, path, digest}`` of each input the contract names, as staged."""
    unchanged: bool | None
    """None: not checked."""
    problem: str | None = None
    """What changed, the first differing path first."""


INPUT_TREE = "input-tree.json"
"""``record/input-tree.json``: the listing of ``input/`` as staged (:func:`_record_tree`)."""


def staged_tree(job: JobDir) -> tuple[dict[str, inputs.Entry], list[dict[str, str]]]:
    """The listing of ``input/`` as staged, and the inputs the contract names, from
    ``record/input-tree.json`` (runner-written, never mounted). ValueError saying why it
    cannot be read."""
    try:
        with safefs.open_under(job.record, INPUT_TREE) as f:
            recorded = json.loads(f.read(inputs.MAX_LISTINGS_BYTES))
        return inputs.parse_listing(recorded["listing"]), [dict(i) for i in recorded["inputs"]]
    except safefs.UnsafePath as exc:
        raise ValueError(f"record/{INPUT_TREE}: {exc.problem}") from None
    except OSError as exc:
        raise ValueError(f"record/{INPUT_TREE}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"record/{INPUT_TREE} is not the listing the runner wrote ({exc})"
        ) from None


def recheck_inputs(job: JobDir) -> InputsCheck:
    """Walk ``input/`` again (no link followed, every file hashed) and compare it with the
    listing recorded when it was staged. A listing that cannot be read fails closed
    (``unchanged`` False): the job's inputs cannot be shown to be the ones staged."""
    try:
        expected, named = staged_tree(job)
    except ValueError as exc:
        why = f"they cannot be shown unchanged: {exc}, the listing of input/ as staged"
        return InputsCheck([], False, why)
    # Bounded: a walk that meets many more entries than were staged stops, and says so.
    tally = _Tally(InputRules(max_files=2 * len(expected) + 1000), "input/")
    try:
        found = _stage_tree(job.root, "input", None, tally).entries or {}
    except RefusedError as exc:
        return InputsCheck(named, False, f"input/ cannot be read as it was staged: {exc.message}")
    diff = inputs.first_difference(expected, found, "what was staged", "input/ after the job")
    if diff is None:
        return InputsCheck(named, True)
    return InputsCheck(named, False, f"input/{diff.path} {diff.what}")


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
        # Without recursion: an earlier attempt may have left a tree a thousand deep.
        for dirpath, _depth, dirnames, filenames in safefs.walk(base):
            os.chown(dirpath, uid, gid)
            for name in [*dirnames, *filenames]:
                path = Path(dirpath) / name
                try:
                    st = os.lstat(path)
                except OSError as exc:  # past PATH_MAX: the job's own, and never the runner's
                    if exc.errno == errno.ENAMETOOLONG:
                        continue
                    raise
                if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                    # A hard link may share its bytes with the input cache (or anything else
                    # on the host): never hand such a file to the job. The runner's own copies
                    # have one link; what the job linked itself is the job's already.
                    continue
                os.chown(path, uid, gid, follow_symlinks=False)


def _sha256_stream(f: BinaryIO, limit: int) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    while size < limit and (chunk := f.read(min(CHUNK, limit - size))):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def sha256_under(base: Path, rel: str, max_bytes: int) -> tuple[str | None, int]:
    """Hex sha256 and size of ``base/rel``, a file a job or a contract author controls: a
    regular file reached without following any link (:mod:`runner.core.safefs`). A file over
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
