"""Resource accounting against the real engine: a job that burns CPU, allocates memory and
writes to disk, then idles; while it idles the test reads the container's cgroup files itself
(cgroup v1, as this host's Docker runs: cpuacct, memory, blkio, pids), and the envelope's
figures must agree with them within the stated tolerances. Docker under runc and runsc, and
rootful Podman (its own stats stream, which gives no peak: the peak is sampled)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from runner.models.resources import SERIES_MAX_POINTS
from tests.support import docker, running_containers, start_job, write_contract

pytestmark = pytest.mark.docker

CGROUP = Path("/sys/fs/cgroup")
ALLOCATE_MIB = 160
WRITE_MIB = 32
JOB = f"""
import os, sys, time
t = time.process_time()
while time.process_time() - t < 1.5:
    pass
block = bytearray({ALLOCATE_MIB} << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
time.sleep(1.5)  # held over a sample or more (Podman gives no peak: it is sampled)
with open('/job/output/blob', 'wb') as f:
    for _ in range({WRITE_MIB}):
        f.write(os.urandom(1 << 20))
    f.flush()
    os.fsync(f.fileno())
del block
open('/job/output/phase', 'w').write('idle')
print('{{"accuracy": 0.5}}')
sys.stdout.flush()
time.sleep(5)
"""


ROOTFUL = "unix:///run/podman/podman.sock"


def _cgroup(engine: str, controller: str, container_id: str, name: str) -> str | None:
    where = "docker" if engine == "docker" else f"libpod_parent/libpod-{container_id}"
    path = CGROUP / controller / where / (container_id if engine == "docker" else "") / name
    try:
        return path.read_text()
    except OSError:
        return None


def _blkio_write(text: str | None) -> int | None:
    """The bytes written as blkio.throttle.io_service_bytes lists them (None: no device)."""
    if text is None:
        return None
    lines = [line.split() for line in text.splitlines()]
    writes = [int(p[2]) for p in lines if len(p) == 3 and p[1] == "Write"]
    return sum(writes) if writes else None


def _running(engine: str) -> str:
    """The full id of the one job container of this test running under ``engine``."""
    if engine == "docker":
        (short,) = running_containers()
        return docker("inspect", "--format", "{{.Id}}", short).stdout.strip()
    from tests.support import SESSION_ID, SESSION_LABEL

    found = subprocess.run(
        ["podman", "ps", "-q", "--no-trunc", "--filter", f"label={SESSION_LABEL}={SESSION_ID}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    (cid,) = found
    return cid


def _independent(state: Path, engine: str) -> tuple[str, dict[str, Any]]:
    """Wait for the job's idle phase, then read its cgroup files."""
    deadline = time.monotonic() + 180
    while not list(state.rglob("output/phase")):
        assert time.monotonic() < deadline, "the job never reached its idle phase"
        time.sleep(0.2)
    time.sleep(1.5)  # one stats answer of the engine after the work, at least
    cid = _running(engine)
    usage = _cgroup(engine, "cpuacct", cid, "cpuacct.usage")
    peak = _cgroup(engine, "memory", cid, "memory.max_usage_in_bytes")
    return cid, {
        "cpu": None if usage is None else int(usage) / 1e9,
        "peak": None if peak is None else int(peak),
        "write": _blkio_write(_cgroup(engine, "blkio", cid, "blkio.throttle.io_service_bytes")),
    }


@pytest.mark.parametrize(
    ("engine", "runtime"),
    [
        ("docker", "runc"),
        ("docker", "runsc"),
        pytest.param("podman", "runc", marks=pytest.mark.podman),
    ],
)
def test_figures_agree_with_the_cgroup_files(
    tmp_path: Path, image_id: str, engine: str, runtime: str
) -> None:
    contract = write_contract(
        tmp_path, image_id, command=["python3", "-c", JOB], environment={"memoryGb": 0.5}
    )
    state = tmp_path / "state"
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"isolation": runtime, "engine": engine}))
    env_vars = {**os.environ, "CONTAINER_HOST": ROOTFUL} if engine == "podman" else None
    proc = start_job(contract, state, "--policy", str(policy), env=env_vars)
    try:
        cid, seen = _independent(state, engine)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    env = json.loads(out)
    (attempt,) = env["attempts"]
    r = attempt["resources"]
    assert r is not None, err
    assert (r["engine"], r["runtime"]) == (engine, runtime)
    assert r["samples"] >= 3  # about one a second over a run of 7 s or more
    assert r["lastSampleSeconds"] is not None and r["lastSampleSeconds"] >= 3.0
    if seen["cpu"] is None:
        pytest.skip(f"no cgroup v1 files for {runtime} containers on this host: {cid}")
    # CPU: the burn (1.5 s) and the allocation, then idle: the engine's last answer and the
    # test's read both fall in the idle phase (only the engine's health check runs there).
    assert r["cpuSeconds"] >= 1.4
    assert abs(r["cpuSeconds"] - seen["cpu"]) <= 0.1 * seen["cpu"] + 0.2, (r, seen)
    # Memory: Docker gives the kernel's own peak (v1): the allocation plus the written file's
    # page cache. Podman gives none: the most sampled, never above the kernel's, and the
    # allocation was held over a sample.
    assert r["memoryPeakBytes"] >= ALLOCATE_MIB << 20
    if engine == "docker":
        assert r["memoryPeakSource"] == "engine"
        assert abs(r["memoryPeakBytes"] - seen["peak"]) <= 0.05 * seen["peak"], (r, seen)
    else:
        assert r["memoryPeakSource"] == "sampled"
        assert r["memoryPeakBytes"] <= seen["peak"], (r, seen)
    assert r["memoryLimitBytes"] == env["limits"]["memoryBytes"]
    assert r["memoryPeakFraction"] == pytest.approx(r["memoryPeakBytes"] / (512 << 20), abs=1e-3)
    # I/O: what the block controller charged; where it charges nothing (this host's disk
    # under cgroup v1 lists no device), the figure is absent, never 0.
    if not seen["write"]:
        assert r["ioWriteBytes"] in (None, 0), (r, seen)
    else:
        assert abs(r["ioWriteBytes"] - seen["write"]) <= 0.1 * seen["write"], (r, seen)
    if runtime == "runc":
        assert 1 <= r["pidsPeak"] <= env["limits"]["pidsLimit"]
    else:
        assert r["pidsPeak"] is None  # the sandbox's threads, not the job's processes
    # The series: bounded, in order, its peaks within the figures.
    series = json.loads((Path(env["jobDir"]) / r["series"]).read_text())["series"]
    assert 3 <= len(series["t"]) <= SERIES_MAX_POINTS
    assert series["t"] == sorted(series["t"])
    assert max(m for m in series["memoryBytes"] if m is not None) <= r["memoryPeakBytes"]
    assert series["cpuSeconds"][-1] == r["cpuSeconds"]
    totals = env["resources"]
    assert totals["attempts"] == 1 and totals["cpuSeconds"] == r["cpuSeconds"]
