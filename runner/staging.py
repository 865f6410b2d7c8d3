"""The job directory: where a job's inputs, outputs and records live on the host.

Layout of ``<state>/jobs/<job id>/``::

    input/        the contract's inputs (paper, repository) and task.json; mounted read-only
    output/       the job's evidence, stdout and stderr; mounted read-write
    workspace/    scratch the job may keep; mounted read-write
    execution/    runner-owned files the job may read (runtime-budget.json, input-manifest.json);
                  mounted read-only
    record/       runner-owned, never mounted: container state, engine log
    result.json   the result envelope, written last and atomically
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.contract import VerifiedContract
from runner.errors import ContractError, EvidenceParseError

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
    def record(self) -> Path:
        return self.root / "record"

    @property
    def envelope(self) -> Path:
        return self.root / "result.json"


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


def _copy_hashed(src: Path, dst: Path) -> StagedFile:
    digest = hashlib.sha256()
    size = 0
    with src.open("rb") as fin, dst.open("wb") as fout:
        while chunk := fin.read(CHUNK):
            digest.update(chunk)
            fout.write(chunk)
            size += len(chunk)
    os.chmod(dst, 0o755 if os.stat(src).st_mode & stat.S_IXUSR else 0o644)
    return StagedFile(path="", sha256=digest.hexdigest(), size=size)


def _stage_tree(src: Path, dst_root: Path, rel: str, field: str) -> list[StagedFile]:
    """Copy ``src`` (file or folder) to ``dst_root/rel``, hashing every file on the way."""
    if src.is_symlink():
        raise ContractError(
            f"{src} is a symbolic link; inputs are copied as plain files and folders",
            path=field,
            hint="replace the link with the file it points to",
        )
    target = dst_root / rel
    if src.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = _copy_hashed(src, target)
        return [StagedFile(rel, staged.sha256, staged.size)]
    if not src.is_dir():
        raise ContractError(
            f"{src} does not exist", path=field, hint="fix the path or add the file"
        )
    out: list[StagedFile] = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        here = Path(dirpath)
        sub = here.relative_to(src)
        (target / sub).mkdir(parents=True, exist_ok=True)
        for name in [*sorted(filenames), *(d for d in dirnames if (here / d).is_symlink())]:
            path = here / name
            if path.is_symlink():
                raise ContractError(
                    f"{path} is a symbolic link; inputs are copied as plain files and folders",
                    path=field,
                    hint="replace the link with the file it points to, or remove it",
                )
            staged = _copy_hashed(path, target / sub / name)
            out.append(StagedFile(str(Path(rel) / sub / name), staged.sha256, staged.size))
    return out


def _normalized(rel: str) -> str:
    return os.path.normpath(rel)


def prepare(root: Path) -> JobDir:
    """Create the job directory's folders (idempotent)."""
    job = JobDir(root)
    for folder in (job.input, job.output, job.workspace, job.execution, job.record):
        folder.mkdir(parents=True, exist_ok=True)
    return job


def stage_inputs(job: JobDir, contract: VerifiedContract) -> list[StagedFile]:
    """Copy the contract's inputs into ``input/`` (replacing what was there), hash them, and
    place the verified contract bytes at ``input/task.json``. Returns the input manifest."""
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
    ]
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
        src = contract.base_dir / rel
        files.extend(_stage_tree(src, job.input, rel, field))
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
        (job.output / rel).parent.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return  # the job runs as the caller's own uid, which owns these folders already
    for base in (job.output, job.workspace):
        for dirpath, dirnames, filenames in os.walk(base):
            os.chown(dirpath, uid, gid)
            for name in [*dirnames, *filenames]:
                os.chown(Path(dirpath) / name, uid, gid, follow_symlinks=False)


def write_budget(job: JobDir, limit_seconds: float, consumed_seconds: float) -> None:
    """Write ``execution/runtime-budget.json`` (atomically; the job reads it read-only)."""
    write_json(
        job.execution / "runtime-budget.json",
        {
            "schemaVersion": "1.0",
            "limitSeconds": round(limit_seconds, 3),
            "consumedSeconds": round(consumed_seconds, 3),
            "remainingSeconds": round(max(limit_seconds - consumed_seconds, 0.0), 3),
        },
    )


def sha256_file(path: Path) -> tuple[str, int]:
    """Hex sha256 and size of ``path``, read in chunks."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def resolve_inside(base: Path, rel: str) -> Path:
    """``base/rel``, refusing a result that escapes ``base`` through a symlink the job made."""
    candidate = (base / rel).resolve()
    if not candidate.is_relative_to(base.resolve()):
        raise EvidenceParseError(
            f"{rel} resolves outside {base.name}/ through a symbolic link; evidence must be a "
            "plain file the job wrote"
        )
    return candidate
