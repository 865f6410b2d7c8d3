"""Regression tests for issue 25 items 4 and 5, against the real engine where a container is
involved: a cached input swapped under a signed contract (a same-size edit with its mtime
restored to the nanosecond), an input changed on the host while the job runs, and a sparse
input filling the disk through the job's working copy. With HOSTILE_REPORT_FILE set, each
engine case is recorded for scripts/hostile_report.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
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
from runner.staging.jobdir import StateDir
from tests.support import (
    json_measurement,
    run_job,
    start_job,
    wait_running,
    write_contract,
)
from tests.support.hostile import py, record

GIB = 1024**3
MIB = 1024**2
SPARSE = 3 * GIB
SMALL = 16 * MIB
"""What a copy of the 3 GiB sparse file (4 KiB of data) may take: a little, never gigabytes."""

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


# -- item 4: a cached input swapped under a signed contract ------------------------------------


@pytest.mark.docker
@pytest.mark.hostile
def test_a_cached_file_edited_same_size_with_its_mtime_restored_never_runs(
    tmp_path: Path, image_id: str
) -> None:
    """Job 1 caches the inputs; a local user edits the cached value.txt (same size, same
    inode, mtime restored with os.utime(ns=)); job 2, bound to the same digests, is staged
    from the source again (the changed ctime makes the runner re-hash the file, which no
    longer hashes to the manifest) and reports the signed value, never the edited one."""
    contract = _value_contract(tmp_path / "c", image_id)
    state = tmp_path / "state"
    code, env, err = run_job(contract, state, "--job-id", "first")
    assert code == 0, (env.get("failure"), err)
    assert env["measurements"][0]["value"] == 0.1
    cache = InputCache.of_state(state)
    hexd = _repo_hex(contract)
    cached = cache.data(hexd) / "value.txt"
    assert cached.read_bytes() == b"0.1\n"
    _swap(cached, b"0.7\n")
    code, env, err = run_job(
        contract, state, "--job-id", "second", env={"RUNNER_LOG_LEVEL": "warning"}
    )
    record("cached input swapped, mtime restored", "runc", env)
    assert code == 0, (env.get("failure"), err)
    assert env["measurements"][0]["value"] == 0.1, env
    assert env["inputsUnchanged"] is True, env.get("warnings")
    job = Path(env["jobDir"])
    assert (job / "input" / "repository" / "value.txt").read_bytes() == b"0.1\n"
    assert "is not as it was made" in err and "does not hash" in err, err
    assert cache.data(hexd).joinpath("value.txt").read_bytes() == b"0.1\n"  # cached afresh
    assert inputcache.verify(cache, remove=False) == {}


@pytest.mark.docker
@pytest.mark.hostile
def test_an_input_changed_on_the_host_during_the_job_is_input_digest_mismatch(
    tmp_path: Path, image_id: str
) -> None:
    """While the job sleeps, the host edits input/repository/value.txt in place (a hard link
    to the input cache's inode: same size, mtime restored). The job reads the edited value;
    the re-hash of input/ after it makes the run `input_digest_mismatch` (exit 3, the path
    named, no measurement a result), never `succeeded`; the cache entry it was staged from is
    removed, so the next job runs the signed bytes."""
    contract = _value_contract(tmp_path / "c", image_id, pause="6")
    state = tmp_path / "state"
    proc = start_job(contract, state, "--job-id", "edited")
    wait_running(proc)
    (staged,) = state.glob("jobs/edited/input/repository/value.txt")
    _swap(staged, b"0.7\n")
    out, err = proc.communicate(timeout=300)
    env: dict[str, Any] = json.loads(out)
    record("input changed on the host during the job", "runc", env)
    assert proc.returncode == 3, (env.get("failure"), err)
    assert env["status"] == "failed"
    assert env["failure"]["category"] == "input_digest_mismatch", env["failure"]
    assert "input/repository/value.txt" in env["failure"]["reason"], env["failure"]
    assert env["inputsUnchanged"] is False
    assert _repo_hex(contract) not in InputCache.of_state(state).hexes()
    code, env, err = run_job(contract, state, "--job-id", "after")
    assert code == 0, (env.get("failure"), err)
    assert env["measurements"][0]["value"] == 0.1


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


def test_copy_sparse_keeps_holes_and_hashes_the_whole_file(tmp_path: Path) -> None:
    """The one copy routine: data, a 1 GiB hole, data, a hole at the end. The copy has the
    same bytes and size, takes about what the data takes, and the digest is the file's."""
    src = tmp_path / "src"
    with src.open("wb") as f:
        f.write(b"head" * 1000)
        f.seek(GIB, os.SEEK_CUR)
        f.write(b"tail" * 1000)
        f.truncate(2 * GIB)
    dst = tmp_path / "dst"
    fd = os.open(src, os.O_RDONLY)
    out = os.open(dst, os.O_WRONLY | os.O_CREAT, 0o644)
    digest = hashlib.sha256()
    try:
        assert safefs.copy_sparse(fd, out, os.fstat(fd).st_size, digest) == 2 * GIB
    finally:
        os.close(fd)
        os.close(out)
    st = os.stat(dst)
    assert st.st_size == 2 * GIB
    assert st.st_blocks * 512 < MIB, st.st_blocks
    with src.open("rb") as f:
        assert digest.hexdigest() == hashlib.file_digest(f, "sha256").hexdigest()
    with src.open("rb") as a, dst.open("rb") as b:
        assert a.read(8192) == b.read(8192)
        a.seek(GIB + 4000)
        b.seek(GIB + 4000)
        assert a.read(8192) == b.read(8192)


def _sparse_repo(folder: Path, image: str, disk_gb: float | None = None) -> Path:
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
        f.truncate(SPARSE)
    return contract


def test_every_copy_of_a_sparse_input_stays_sparse_without_the_engine(tmp_path: Path) -> None:
    """Staging into input/, the input cache's copy onto another file system (tmpfs: link(2)
    fails with EXDEV) and the working copy each keep a 3 GiB sparse file sparse."""
    contract_path = _sparse_repo(tmp_path / "c", "sha256:" + "ab" * 32)
    issuer.pin(contract_path)
    contract = load_contract(contract_path)
    state = StateDir(tmp_path / "state")
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
                assert st.st_size == SPARSE, rel
                assert st.st_blocks * 512 < SMALL, (root, rel, st.st_blocks)
    finally:
        shutil.rmtree(other, ignore_errors=True)


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


@pytest.mark.docker
@pytest.mark.hostile
def test_a_sparse_input_stays_sparse_in_the_working_copy(tmp_path: Path, image_id: str) -> None:
    """A 3 GiB sparse file in repository/ (4 KiB of data): input/ and workspace/repository
    both keep it sparse (st_blocks stays tiny), the job sees the whole apparent size, and the
    run's disk accounting (output/ and workspace/, the working copy included) stays small."""
    contract = _sparse_repo(tmp_path / "c", image_id)
    state = tmp_path / "state"
    started = time.monotonic()
    code, env, err = run_job(contract, state)
    took = time.monotonic() - started
    record("sparse input, working copy", "runc", env, seconds=round(took, 1))
    assert code == 0, (env.get("failure"), err)
    job = Path(env["jobDir"])
    seen = json.loads((job / "output" / "out.json").read_text())
    assert seen["size"] == SPARSE
    for rel in ("input/repository/big.bin", "workspace/repository/big.bin"):
        st = os.stat(job / rel)
        assert st.st_size == SPARSE
        assert st.st_blocks * 512 < SMALL, (rel, st.st_blocks)
    assert seen["blocks"] * 512 < SMALL
    assert env["disk"]["usedBytes"] < 4 * SMALL, env["disk"]


@pytest.mark.docker
@pytest.mark.hostile
def test_a_working_copy_larger_than_the_disk_quota_is_refused(
    tmp_path: Path, image_id: str
) -> None:
    """24 MiB of real data in repository/ against `diskGb: 0.01` (10 MB): the working copy
    is stopped before it writes past the quota and the run is refused (`policy_violation`,
    exit 3, at the stage step, naming $.repository.path and diskGb); no container ran and
    workspace/ holds nothing of it."""

    def change(data: dict[str, Any]) -> None:
        data["environment"]["diskGb"] = 0.01

    contract = write_contract(
        tmp_path / "c", image_id, command=["true"], measurements=None, change=change
    )
    (tmp_path / "c" / "repository" / "data.bin").write_bytes(os.urandom(24 * MIB))
    code, env, err = run_job(contract, tmp_path / "state")
    record("working copy over the disk quota", "runc", env)
    assert code == 3, (env.get("failure"), err)
    failure = env["failure"]
    assert failure["category"] == "policy_violation" and failure["stage"] == "stage", failure
    assert "$.repository.path" in failure["reason"] and "diskGb" in failure["reason"]
    workspace = Path(env["jobDir"]) / "workspace"
    assert safe_usage(workspace) < 10 * 1000**2


def safe_usage(folder: Path) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(folder):
        for name in names:
            total += os.lstat(Path(dirpath) / name).st_blocks * 512
    return total


@pytest.mark.docker
@pytest.mark.hostile
def test_a_job_that_writes_past_the_quota_and_exits_at_once_is_disk_quota_exceeded(
    tmp_path: Path, image_id: str
) -> None:
    """24 MiB written to /job/output against `diskGb: 0.01`, and exit 0 at once (within one
    tick of the runner's watch, before any measurement): the quota is measured again as the
    container ends, and the run is `disk_quota_exceeded`, not `succeeded`."""

    def change(data: dict[str, Any]) -> None:
        data["environment"]["diskGb"] = 0.01

    code = (
        "import json, os\n"
        "open('/job/output/fill.bin', 'wb').write(os.urandom(24 * 1024 * 1024))\n"
        "json.dump({'accuracy': 1.0}, open('/job/output/out.json', 'w'))\n"
    )
    contract = write_contract(
        tmp_path / "c",
        image_id,
        command=py(code),
        measurements=[json_measurement("out.json")],
        change=change,
    )
    code_, env, err = run_job(contract, tmp_path / "state")
    record("quota passed within one tick", "runc", env)
    assert env["failure"] is not None, env
    assert env["failure"]["category"] == "disk_quota_exceeded", env["failure"]
    assert code_ == 1, err
    assert env["disk"]["usedBytes"] > env["disk"]["quotaBytes"]


def test_a_sparse_evidence_file_stays_sparse_in_an_export(tmp_path: Path) -> None:
    """The bundle's copy of an output file (beside the archive or inline) goes through the one
    copy routine: a 3 GiB sparse evidence file takes a few KiB in the bundle's folder, and
    its SHA-256 is the whole file's (the envelope's digest still matches)."""
    src = tmp_path / "evidence.bin"
    with src.open("wb") as f:
        f.seek(SPARSE - 4096)
        f.write(b"x" * 4096)
    want = hashlib.sha256()
    with src.open("rb") as f:
        while chunk := f.read(MIB):
            want.update(chunk)
    dst = tmp_path / "copy.bin"
    with src.open("rb") as f:
        digest, copied = export._copy_stream(f, dst, SPARSE)
    assert (digest, copied) == (want.hexdigest(), SPARSE)
    assert dst.stat().st_size == SPARSE
    assert dst.stat().st_blocks * 512 < SMALL
