"""Regression tests for issue 25 items 4 and 5, against the real engine where a container is
involved: a cached input swapped under a signed contract (a same-size edit with its mtime
restored to the nanosecond), an input changed on the host while the job runs, and a sparse
input filling the disk through the job's working copy. With HOSTILE_REPORT_FILE set, each
engine case is recorded for scripts/hostile_report.py.

The tests that need no engine are in tests/unit/test_hostile_inputs_round3.py.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from runner.caches import inputcache
from runner.caches.inputcache import InputCache
from tests.support import (
    json_measurement,
    run_job,
    start_job,
    wait_running,
    write_contract,
)
from tests.support.hostile import py, record
from tests.unit.test_hostile_inputs_round3 import (
    GIB,
    MIB,
    SMALL,
    SPARSE,
    _repo_hex,
    _sparse_repo,
    _swap,
    _value_contract,
    check_copy_sparse,
    check_every_copy_stays_sparse,
    check_export_stays_sparse,
)

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


# -- the multi-GiB variants of the quick sparse checks in tests/unit --------------------------


@pytest.mark.slow
def test_copy_sparse_keeps_a_gib_hole_and_hashes_the_whole_file(tmp_path: Path) -> None:
    """Data, a 1 GiB hole, data, a hole to 2 GiB: holes kept, the whole file hashed."""
    check_copy_sparse(tmp_path, GIB, GIB - 8000, MIB)


@pytest.mark.slow
def test_every_copy_of_a_3_gib_sparse_input_stays_sparse_without_the_engine(
    tmp_path: Path,
) -> None:
    """Staging, the input cache's copy onto tmpfs and the working copy of a 3 GiB sparse file."""
    check_every_copy_stays_sparse(tmp_path, SPARSE, SMALL)


@pytest.mark.slow
def test_a_3_gib_sparse_evidence_file_stays_sparse_in_an_export(tmp_path: Path) -> None:
    """A 3 GiB evidence file (a hole, then 4 KiB of data) stays sparse in an export."""
    check_export_stays_sparse(tmp_path, SPARSE, SMALL)
