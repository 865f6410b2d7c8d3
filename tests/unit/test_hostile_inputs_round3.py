"""Regression tests for issue 25 items 4 and 5, against the real engine where a container is
involved: a cached input swapped under a signed contract (a same-size edit with its mtime
restored to the nanosecond), an input changed on the host while the job runs, and a sparse
input filling the disk through the job's working copy. With HOSTILE_REPORT_FILE set, each
engine case is recorded for scripts/hostile_report.py.

The tests that need the engine are in tests/integration/test_hostile_inputs_round3.py.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from runner.app import issuer
from runner.caches import inputcache
from runner.caches.inputcache import InputCache
from runner.contract import VerifiedContract, load_contract
from runner.core import safefs
from runner.core.errors import PolicyViolation
from runner.execution import layout
from runner.results.bundle import export
from runner.staging import jobdir as staging
from runner.state.jobdir import StateDir
from tests.support import (
    json_measurement,
    write_contract,
)
from tests.support.hostile import py

GIB = 1024**3
MIB = 1024**2
SPARSE = 3 * GIB
"""The sparse file of the engine case and the slow variants (tests/integration)."""
SMALL = 16 * MIB
"""What a copy of the 3 GiB sparse file (4 KiB of data) may take: a little, never gigabytes."""
UNIT_HOLE = 48 * MIB
"""The hole of the quick cases here: many copy chunks of it, and a dense copy (or one that
wrote the hole's zeros) takes fifty times the block bound below, so each still fails if
holes are read or written; the multi-GiB variants of the same checks are in
tests/integration/test_hostile_inputs_round3.py (marked slow)."""
UNIT_BLOCKS = MIB
"""What a copy of a sparse file of the quick cases (a few KiB of data) may take."""


READ_VALUE = r"""
import json, time
time.sleep(float(open("/job/input/repository/pause.txt").read()))
value = float(open("/job/input/repository/value.txt").read())
json.dump({"accuracy": value}, open("/job/output/out.json", "w"))
"""


def _value_contract(folder: Path, image: str, pause: str = "0") -> Path:
    """A pinned contract whose job reports the number in repository/value.txt (``0.1``),
    after sleeping ``pause`` seconds (repository/pause.txt)."""
    contract = write_contract(
        folder, image, command=py(READ_VALUE), measurements=[json_measurement("out.json")]
    )
    (folder / "repository" / "value.txt").write_text("0.1\n")
    (folder / "repository" / "pause.txt").write_text(pause)
    issuer.pin(contract)
    return contract


def _repo_hex(contract: Path) -> str:
    digest = str(load_contract(contract).model.repository.digest)  # type: ignore[union-attr]
    return digest.removeprefix("sha256:")


def _swap(path: Path, body: bytes) -> None:
    """What a local user does to a read-only cached file: the same number of bytes written
    in place (same inode), the modification time put back to the nanosecond."""
    before = os.lstat(path)
    assert len(body) == before.st_size
    os.chmod(path, 0o644)
    with path.open("r+b") as f:
        f.write(body)
    os.chmod(path, stat_mode(before))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.lstat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    ), "the swap must keep what the old freshness check compared"


def stat_mode(st: os.stat_result) -> int:
    return st.st_mode & 0o7777


def _pinned(folder: Path, image: str) -> VerifiedContract:
    path = write_contract(folder, image)
    issuer.pin(path)
    return load_contract(path)


def test_a_cached_entry_is_rehashed_only_when_it_cannot_be_shown_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second job links the cached files without reading them (their stamps match);
    removing a job folder that links the cached inodes changes their ctime, so the next job
    re-hashes them, finds them whole and links them as before, recording the stamps it saw."""
    contract = _pinned(tmp_path / "c", "sha256:" + "ab" * 32)
    state = StateDir(tmp_path / "state")
    cache = InputCache.of_state(state.root)
    rehashed: list[str] = []
    real = inputcache._rehash

    def counting(path: str | Path, row: dict[str, Any], st: os.stat_result) -> None:
        rehashed.append(row["path"])
        real(path, row, st)

    monkeypatch.setattr(inputcache, "_rehash", counting)

    def stage(job_id: str) -> inputcache.Staged:
        job = staging.prepare(state.job(job_id).root)
        done = inputcache.Staged([], [], [])
        staging.stage_inputs(job, contract, via=inputcache.stager(cache, job, done=done))
        return done

    stage("j1")
    done = stage("j2")
    assert done.copied == [] and len(done.linked) == 2 and rehashed == []
    hexd = str(contract.model.paper.digest).removeprefix("sha256:")  # type: ignore[union-attr]
    before = cache.seen(hexd)[""]
    shutil.rmtree(state.job("j1").root)
    assert inputcache.stamp(os.lstat(cache.data(hexd))) != before  # the ctime moved
    done = stage("j3")
    assert done.copied == [] and len(done.linked) == 2
    assert "" in rehashed  # the paper (a file entry) was read again, and was whole
    assert cache.seen(hexd)[""] == inputcache.stamp(os.lstat(cache.data(hexd)))
    rehashed.clear()
    stage("j4")
    assert rehashed == []


# -- item 5: a sparse input and the working copy ----------------------------------------------


def check_copy_sparse(folder: Path, hole: int, tail_hole: int, blocks: int) -> None:
    """The one copy routine on a file of data, a ``hole``, data, then a ``tail_hole`` (0: the
    file ends in data). The copy has the same bytes and size, takes under ``blocks`` bytes,
    and the digest is the whole file's."""
    src = folder / "src"
    with src.open("wb") as f:
        f.write(b"head" * 1000)
        f.seek(hole, os.SEEK_CUR)
        f.write(b"tail" * 1000)
        if tail_hole:
            f.truncate(f.tell() + tail_hole)
    size = src.stat().st_size
    dst = folder / "dst"
    fd = os.open(src, os.O_RDONLY)
    out = os.open(dst, os.O_WRONLY | os.O_CREAT, 0o644)
    digest = hashlib.sha256()
    try:
        assert safefs.copy_sparse(fd, out, os.fstat(fd).st_size, digest) == size
    finally:
        os.close(fd)
        os.close(out)
    st = os.stat(dst)
    assert st.st_size == size
    assert st.st_blocks * 512 < blocks, st.st_blocks
    with src.open("rb") as f:
        assert digest.hexdigest() == hashlib.file_digest(f, "sha256").hexdigest()
    with src.open("rb") as a, dst.open("rb") as b:
        assert a.read(8192) == b.read(8192)
        a.seek(hole + 4000)
        b.seek(hole + 4000)
        assert a.read(8192) == b.read(8192)
        a.seek(size - 8192)
        b.seek(size - 8192)
        assert a.read() == b.read()


@pytest.mark.parametrize("tail_hole", [UNIT_HOLE + 12345, 0], ids=["hole-at-end", "data-at-end"])
def test_copy_sparse_keeps_holes_and_hashes_the_whole_file(tmp_path: Path, tail_hole: int) -> None:
    """Data, a hole, data, and a hole at the end or data at the end (holes of many copy
    chunks, one ending off a chunk's edge): holes kept, the whole file hashed."""
    check_copy_sparse(tmp_path, UNIT_HOLE, tail_hole, UNIT_BLOCKS)


def _sparse_repo(
    folder: Path, image: str, disk_gb: float | None = None, size: int = SPARSE
) -> Path:
    """A contract whose repository holds big.bin: 4 KiB of data, then a hole to ``size``."""

    def change(data: dict[str, Any]) -> None:
        if disk_gb is not None:
            data["environment"]["diskGb"] = disk_gb

    code = (
        "import json, os\n"
        "st = os.stat('/job/workspace/repository/big.bin')\n"
        "json.dump({'accuracy': 1.0, 'size': st.st_size, 'blocks': st.st_blocks},"
        " open('/job/output/out.json', 'w'))\n"
    )
    contract = write_contract(
        folder,
        image,
        command=py(code),
        measurements=[json_measurement("out.json")],
        change=change,
    )
    with (folder / "repository" / "big.bin").open("wb") as f:
        f.write(b"x" * 4096)
        f.truncate(size)
    return contract


def check_every_copy_stays_sparse(folder: Path, size: int, blocks: int) -> None:
    """Staging into input/, the input cache's copy onto another file system (tmpfs: link(2)
    fails with EXDEV) and the working copy each keep a sparse file of ``size`` bytes (4 KiB
    of data) sparse: under ``blocks`` bytes each."""
    contract_path = _sparse_repo(folder / "c", "sha256:" + "ab" * 32, size=size)
    issuer.pin(contract_path)
    contract = load_contract(contract_path)
    state = StateDir(folder / "state")
    cache = InputCache.of_state(state.root)
    job = staging.prepare(state.job("j1").root)
    staging.stage_inputs(job, contract, via=inputcache.stager(cache, job))
    assert layout.working_copy(job, contract, 100 * GIB)
    other = Path("/dev/shm") / f"runner-test-sparse-{os.getpid()}"
    try:
        shm_job = staging.prepare(other / "job")
        done = inputcache.Staged([], [], [])
        staging.stage_inputs(shm_job, contract, via=inputcache.stager(cache, shm_job, done=done))
        assert "$.repository.path" in done.linked
        assert layout.working_copy(shm_job, contract, 100 * GIB)
        for root in (job.root, shm_job.root):
            for rel in ("input/repository/big.bin", "workspace/repository/big.bin"):
                st = os.stat(root / rel)
                assert st.st_size == size, rel
                assert st.st_blocks * 512 < blocks, (root, rel, st.st_blocks)
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_every_copy_of_a_sparse_input_stays_sparse_without_the_engine(tmp_path: Path) -> None:
    """Each copy of a sparse input (a hole at the end) stays sparse."""
    check_every_copy_stays_sparse(tmp_path, UNIT_HOLE, UNIT_BLOCKS)


def test_a_working_copy_over_the_disk_quota_is_refused_before_it_is_written(
    tmp_path: Path,
) -> None:
    """The working copy counts against the job's disk quota as it is written: 8 MiB of real
    data against a 2 MiB quota is refused naming the field and the quota, and nothing of the
    copy is left in workspace/."""
    contract_path = write_contract(tmp_path / "c", "sha256:" + "ab" * 32)
    (tmp_path / "c" / "repository" / "data.bin").write_bytes(os.urandom(8 * MIB))
    contract = load_contract(contract_path)
    job = staging.prepare(tmp_path / "job")
    staging.stage_inputs(job, contract)
    with pytest.raises(PolicyViolation, match=r"repository\.path.*disk quota") as got:
        layout.working_copy(job, contract, 2 * MIB)
    assert "diskGb" in str(got.value)
    assert list(job.workspace.iterdir()) == []


def check_export_stays_sparse(folder: Path, size: int, blocks: int) -> None:
    """The bundle's copy of an output file (beside the archive or inline) goes through the one
    copy routine: a sparse evidence file of ``size`` bytes (a hole, then 4 KiB of data at the
    end) takes under ``blocks`` bytes in the bundle's folder, and its SHA-256 is the whole
    file's (the envelope's digest still matches)."""
    src = folder / "evidence.bin"
    with src.open("wb") as f:
        f.seek(size - 4096)
        f.write(b"x" * 4096)
    with src.open("rb") as f:
        want = hashlib.file_digest(f, "sha256").hexdigest()
    dst = folder / "copy.bin"
    with src.open("rb") as f:
        digest, copied = export._copy_stream(f, dst, size)
    assert (digest, copied) == (want, size)
    assert dst.stat().st_size == size
    assert dst.stat().st_blocks * 512 < blocks
    with dst.open("rb") as f:
        f.seek(size - 4096)
        assert f.read() == b"x" * 4096


def test_a_sparse_evidence_file_stays_sparse_in_an_export(tmp_path: Path) -> None:
    """An evidence file that is a hole, then data at the end, stays sparse in an export."""
    check_export_stays_sparse(tmp_path, UNIT_HOLE, UNIT_BLOCKS)
