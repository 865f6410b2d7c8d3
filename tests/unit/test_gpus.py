"""GPU allotment on a GPU-less machine: selection, locking and fallback with the detection
layer faked; the engine's own behaviour without a GPU driver for real."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from runner.contract import Trust
from runner.core.errors import GpuUnavailable
from runner.execution import orchestrator
from runner.gpu import gpus
from runner.gpu.gpus import Allocator, Gpu, HostDetector, parse_smi
from runner.planning import policy
from runner.state.ledger import read_state
from tests.support import ROOT, SESSION_ID, SESSION_LABEL, docker, write_contract

FAKE = [
    Gpu(0, "GPU-00000000-fake-0000-0000-000000000000", "Fake H100", 80 * 1024**3, "550.54"),
    Gpu(1, "GPU-11111111-fake-1111-1111-111111111111", "Fake H100", 80 * 1024**3, "550.54"),
]


class FakeDetector:
    def __init__(self, found: list[Gpu]) -> None:
        self.found = found

    def detect(self) -> list[Gpu]:
        return list(self.found)


def _owner(name: str) -> dict[str, Any]:
    return {"jobDir": f"/jobs/{name}", "containerName": f"c-{name}"}


def test_each_job_gets_its_own_devices(tmp_path: Path) -> None:
    alive = Allocator(tmp_path, lambda holder: True)
    a = alive.allocate(1, FAKE, _owner("a"))
    b = alive.allocate(1, FAKE, _owner("b"))
    assert {a[0].uuid, b[0].uuid} == {g.uuid for g in FAKE}
    with pytest.raises(GpuUnavailable, match="0 of 2 free") as err:
        alive.allocate(1, FAKE, _owner("c"))
    assert err.value.retryable
    alive.release("/jobs/a")
    assert alive.allocate(1, FAKE, _owner("c")) == a


def test_a_dead_holder_is_reclaimed_a_live_one_never(tmp_path: Path) -> None:
    """A lock whose runner and container are both gone is reclaimed; one whose container
    still runs (its runner crashed) is kept."""
    dead = {"/jobs/a"}
    allocator = Allocator(tmp_path, lambda holder: holder["jobDir"] not in dead)
    allocator.allocate("all", FAKE, _owner("a"))
    got = allocator.allocate(2, FAKE, _owner("b"))
    assert len(got) == 2
    dead.clear()
    with pytest.raises(GpuUnavailable):
        allocator.allocate(1, FAKE, _owner("c"))


def test_no_gpu_and_too_many(tmp_path: Path) -> None:
    allocator = Allocator(tmp_path, lambda holder: True)
    with pytest.raises(GpuUnavailable, match="has none"):
        allocator.allocate(1, [], _owner("a"))
    with pytest.raises(GpuUnavailable, match="asks for 3 GPUs and this host has 2"):
        allocator.allocate(3, FAKE, _owner("a"))


def _grab(lock_dir: str, name: str, queue: Any) -> None:
    allocator = Allocator(Path(lock_dir), lambda holder: True)
    try:
        queue.put([g.uuid for g in allocator.allocate(1, FAKE * 1, _owner(name))])
    except GpuUnavailable:
        queue.put([])


def test_concurrent_runners_never_share_a_device(tmp_path: Path) -> None:
    """Six processes race for two devices: exactly two win, each a different device."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_grab, args=(str(tmp_path), f"j{i}", queue)) for i in range(6)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=30)
    won = [queue.get(timeout=5) for _ in procs]
    devices = [d for w in won for d in w]
    assert sorted(devices) == sorted(g.uuid for g in FAKE)


def test_nvidia_smi_output_is_read() -> None:
    text = "0, GPU-abc, NVIDIA H100 80GB HBM3, 81559, 550.54.15\n"
    (gpu,) = parse_smi(text)
    assert (gpu.index, gpu.uuid, gpu.model, gpu.driver_version) == (
        0,
        "GPU-abc",
        "NVIDIA H100 80GB HBM3",
        "550.54.15",
    )
    assert gpu.memory_bytes == 81559 * 1024**2


def test_this_machine_has_no_gpu() -> None:
    """Detection on this GPU-less machine answers zero GPUs rather than failing."""
    assert HostDetector().detect() == []


def _options(tmp_path: Path, found: list[Gpu], **policy_fields: Any) -> orchestrator.RunOptions:
    loaded = policy.LoadedPolicy(
        policy.HostPolicy(acceptUnsigned=True, **policy_fields).resolved(), "test"
    )
    return orchestrator.RunOptions(
        state_dir=tmp_path / "state",
        policy=loaded,
        trust=Trust(keys=[]),
        labels={SESSION_LABEL: SESSION_ID},
        gpu_detector=FakeDetector(found),
        gpu_lock_dir=tmp_path / "locks",
        cdi_dirs=(tmp_path / "cdi",),
    )


def _gpu_contract(tmp_path: Path, image_id: str, *, fallback: bool) -> Path:
    path = write_contract(tmp_path, image_id, environment={"gpu": 1})
    data = json.loads(path.read_text())
    data["computeRequirement"]["cpuFallbackAllowed"] = fallback
    from runner.contract import with_digest

    path.write_text(json.dumps(with_digest(data)))
    return path


@pytest.mark.docker
def test_engine_without_driver_is_gpu_unavailable(tmp_path: Path, image_id: str) -> None:
    """The engine accepts the device request and fails at start: the container is removed,
    the failure is gpu_unavailable, and the device lock is released."""
    from runner.backends.docker import DockerBackend

    class ClaimsGpus(DockerBackend):
        """The real engine, except that it says it could hand out GPUs, so that its real
        behaviour at create and start is what the test sees."""

        def gpu_capable(self) -> bool:
            return True

    contract = _gpu_contract(tmp_path, image_id, fallback=False)
    env = orchestrator.run(contract, _options(tmp_path, FAKE[:1]), backend=ClaimsGpus())
    assert env.failure is not None and env.failure.category == "gpu_unavailable"
    assert FAKE[0].uuid in env.failure.reason
    assert env.exitCode is None
    assert orchestrator.failure_exit_family(env) == "infrastructure"
    assert docker("ps", "-aq", "--filter", f"label=org.runner.job-id={env.jobId}").stdout == ""
    assert gpus.Allocator(tmp_path / "locks", lambda _: True).holders() == {}
    # The attempt is recorded as never started: a later run is not charged for it.
    assert env.jobDir is not None
    ledger = read_state(Path(env.jobDir) / "record" / "ledger.jsonl")
    (attempt,) = ledger.attempts
    assert attempt.finished is not None and attempt.finished["how"] == "not-started"
    assert attempt.finished["classification"] == "gpu_unavailable"
    assert ledger.consumed == 0


@pytest.mark.docker
def test_engine_that_cannot_hand_out_gpus_is_detected(tmp_path: Path, image_id: str) -> None:
    """GPUs on the host but no NVIDIA toolkit in the engine (as here), no CDI spec, and no
    driver libraries to write one from: refused before any container is created, the
    device lock released."""
    contract = _gpu_contract(tmp_path, image_id, fallback=False)
    env = orchestrator.run(contract, _options(tmp_path, FAKE[:1]))
    assert env.failure is not None and env.failure.category == "gpu_unavailable"
    assert "libcuda.so and libnvidia-ml.so for driver 550.54" in env.failure.reason
    assert env.container is None
    assert gpus.Allocator(tmp_path / "locks", lambda _: True).holders() == {}


@pytest.mark.docker
def test_no_gpu_without_fallback_fails_before_starting(tmp_path: Path, image_id: str) -> None:
    contract = _gpu_contract(tmp_path, image_id, fallback=False)
    env = orchestrator.run(contract, _options(tmp_path, []))
    assert env.failure is not None and env.failure.category == "gpu_unavailable"
    assert env.container is None


@pytest.mark.docker
def test_no_gpu_with_fallback_runs_on_cpu(tmp_path: Path, image_id: str) -> None:
    contract = _gpu_contract(tmp_path, image_id, fallback=True)
    env = orchestrator.run(contract, _options(tmp_path, []))
    assert env.status == "succeeded", env.failure
    assert env.gpus == [] and env.gpuFallback and "has none" in env.gpuFallback
    assert any("ran on CPU only" in w for w in env.warnings)


@pytest.mark.docker
def test_policy_without_gpus_and_fallback_runs_on_cpu(tmp_path: Path, image_id: str) -> None:
    contract = _gpu_contract(tmp_path, image_id, fallback=True)
    env = orchestrator.run(contract, _options(tmp_path, FAKE, maxima={"gpus": 0}))
    assert env.status == "succeeded", env.failure
    assert env.gpuFallback and "policy grants at most 0" in env.gpuFallback
    strict = (
        _gpu_contract(tmp_path / "strict", image_id, fallback=False)
        if ((tmp_path / "strict").mkdir() is None)
        else None
    )
    assert strict is not None
    refused = orchestrator.run(strict, _options(tmp_path / "strict", FAKE, maxima={"gpus": 0}))
    assert refused.failure is not None and refused.failure.category == "policy_violation"


def test_nvml_strings_are_text_from_either_binding() -> None:
    """nvidia-ml-py answers str, older pynvml releases bytes; both become plain text."""
    from runner.gpu.gpus import _text

    assert _text(b"GPU-1234") == "GPU-1234"
    assert _text("NVIDIA H200") == "NVIDIA H200"


ALLOCATE_AS_ANOTHER_USER = """
import json, sys
from pathlib import Path
from runner.core.errors import GpuUnavailable
from runner.gpu.gpus import Allocator, Gpu
gpu = Gpu(**json.loads(sys.argv[2]))
try:
    allocator = Allocator(Path(sys.argv[1]), lambda holder: True)
    got = allocator.allocate(1, [gpu], {"jobDir": "/jobs/b"})
    print("got", got[0].uuid)
except GpuUnavailable as exc:
    print("busy", exc.message)
"""


def test_users_share_one_host_wide_lock_folder(request: pytest.FixtureRequest) -> None:
    """Two users' runners (root and nobody here) are never handed the same GPU: the lock
    folder is shared (mode 1777) and its lock files are readable and writable by both."""
    import json
    import os
    import shutil
    import stat
    import subprocess
    import sys
    import tempfile
    from dataclasses import asdict

    assert os.geteuid() == 0, "the test suite runs as root (see README, Tests)"
    # pytest's own folders are root's only: the shared folder's parent must be reachable.
    shared = Path(tempfile.mkdtemp(prefix="runner-gpu-locks-test-"))
    os.chmod(shared, 0o755)  # noqa: S103 - nobody must reach the shared folder
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    locks = shared / "runner-gpus"

    gpu = json.dumps(asdict(FAKE[0]))
    # A Python that user can run (this venv's may live under root's home): the system's.
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

    def as_nobody() -> str:
        def drop() -> None:
            os.setgid(65534)
            os.setuid(65534)

        proc = subprocess.run(
            [python, "-c", ALLOCATE_AS_ANOTHER_USER, str(locks), gpu],
            capture_output=True,
            text=True,
            preexec_fn=drop,
            env={"PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"},
            check=False,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    root = Allocator(locks, lambda holder: True)
    root.allocate(1, FAKE[:1], _owner("a"))
    assert stat.S_IMODE(locks.stat().st_mode) == 0o1777
    lock = locks / f"{FAKE[0].uuid}.json"
    assert stat.S_IMODE(lock.stat().st_mode) == 0o666
    assert as_nobody().startswith("busy")  # held by root's job: never handed out twice
    root.release("/jobs/a")
    assert as_nobody().startswith(f"got {FAKE[0].uuid}")  # free again, for any user
    assert root.holders()[FAKE[0].uuid]["uid"] == 65534
    with pytest.raises(GpuUnavailable):
        root.allocate(1, FAKE[:1], _owner("c"))
