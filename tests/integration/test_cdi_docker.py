"""CDI specs applied by the runner, on the real engine (Docker 20.10: no CDI support, no
NVIDIA toolkit). The spec's "GPUs" are character devices every host has (``/dev/full``,
``/dev/zero``, ``/dev/null``) renamed in the container, its "driver library" a file: from
inside the job, exactly the allotted device appears, the library is read-only, the
environment is the spec's; with no GPU allotted nothing appears."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.contract import Trust
from runner.execution import orchestrator
from runner.gpu import gpus
from runner.gpu.gpus import Gpu
from runner.planning import policy
from tests.support import SESSION_ID, SESSION_LABEL, write_contract

TWO = [
    Gpu(0, "GPU-00000000-cdi0-0000-0000-000000000000", "Fake H200", 141 * 1024**3, "580.95.05"),
    Gpu(1, "GPU-11111111-cdi1-1111-1111-111111111111", "Fake H200", 141 * 1024**3, "580.95.05"),
]
LIB = "/usr/local/nvidia/lib64/libcuda.so.1"


class Found:
    def __init__(self, found: list[Gpu]) -> None:
        self.found = found

    def detect(self) -> list[Gpu]:
        return list(self.found)


def _spec(tmp_path: Path) -> Path:
    """A CDI spec in ``tmp_path/cdi``: device 0 is /dev/full, device 1 /dev/zero, the control
    node /dev/null, the library a world-writable file (only the mount keeps it read-only)."""
    lib = tmp_path / "libcuda.so.580.95.05"
    lib.write_text("fake-libcuda\n")
    lib.chmod(0o666)
    folder = tmp_path / "cdi"
    folder.mkdir()
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": "0", "containerEdits": {"deviceNodes": [
                {"path": "/dev/nvidia0", "hostPath": "/dev/full"}]}},
            {"name": "1", "containerEdits": {"deviceNodes": [
                {"path": "/dev/nvidia1", "hostPath": "/dev/zero"}]}},
        ],
        "containerEdits": {
            "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": "/dev/null"}],
            "mounts": [{"hostPath": str(lib), "containerPath": LIB, "options": ["ro", "bind"]}],
            "env": ["LD_LIBRARY_PATH=/usr/local/nvidia/lib64", "CDI_TEST=applied"],
        },
    }  # fmt: skip
    (folder / "nvidia.json").write_text(json.dumps(spec))
    return folder


def _options(tmp_path: Path, found: list[Gpu]) -> orchestrator.RunOptions:
    loaded = policy.LoadedPolicy(policy.HostPolicy(acceptUnsigned=True).resolved(), "test")
    return orchestrator.RunOptions(
        state_dir=tmp_path / "state",
        policy=loaded,
        trust=Trust(keys=[]),
        labels={SESSION_LABEL: SESSION_ID},
        gpu_detector=Found(found),
        gpu_lock_dir=tmp_path / "locks",
        cdi_dirs=(tmp_path / "cdi",),
    )


def _contract(tmp_path: Path, image_id: str, script: str, *, fallback: bool) -> Path:
    """A one-GPU job running ``script``; it passes (accuracy 1) only if the script does."""

    def change(data: dict[str, object]) -> None:
        requirement = data["computeRequirement"]
        assert isinstance(requirement, dict)
        requirement["cpuFallbackAllowed"] = fallback

    command = ["sh", "-c", f"{script} || exit 9; echo '{{\"accuracy\": 1}}'"]
    return write_contract(
        tmp_path, image_id, command=command, environment={"gpu": 1}, change=change
    )


INSIDE_ONE_GPU = " && ".join(
    [
        "test -c /dev/nvidia0",
        "test -c /dev/nvidiactl",
        "! test -e /dev/nvidia1",
        # /dev/full behind /dev/nvidia0: reading works, writing says the device is full.
        "test \"$(head -c 3 /dev/nvidia0 | od -An -tx1 | tr -d ' ')\" = 000000",
        "! (echo x > /dev/nvidia0) 2>/dev/null",
        f"grep -q fake-libcuda {LIB}",
        f"! (echo x >> {LIB}) 2>/dev/null",
        'test "$LD_LIBRARY_PATH" = /usr/local/nvidia/lib64',
        'test "$CDI_TEST" = applied',
        'test "$NVIDIA_VISIBLE_DEVICES" = void',
    ]
)


@pytest.mark.docker
def test_the_allotted_gpu_alone_appears_with_its_spec(tmp_path: Path, image_id: str) -> None:
    """Two GPUs on the host, one allotted: its node and the control node appear (with the
    cgroup rule that lets the job read it), the other GPU's does not; the library is mounted
    read-only; the spec's environment is set; the envelope says cdi-applied and names the
    device; the lock is freed after."""
    _spec(tmp_path)
    contract = _contract(tmp_path, image_id, INSIDE_ONE_GPU, fallback=False)
    env = orchestrator.run(contract, _options(tmp_path, TWO))
    assert env.status == "succeeded", (env.failure, env.exitCode)
    (gpu,) = env.gpus
    assert gpu.uuid == TWO[0].uuid and gpu.injection == "cdi-applied"
    assert gpu.cdiDevice == "nvidia.com/gpu=0"
    assert gpus.Allocator(tmp_path / "locks", lambda _: True).holders() == {}


@pytest.mark.docker
def test_a_job_without_a_gpu_sees_no_device(tmp_path: Path, image_id: str) -> None:
    """No GPU on the host and a CPU fallback: no NVIDIA node, no library, no spec env."""
    _spec(tmp_path)
    script = (
        "! ls /dev/nvidia* 2>/dev/null && ! test -e /usr/local/nvidia && "
        'test -z "${CDI_TEST:-}" && test "$NVIDIA_VISIBLE_DEVICES" = void'
    )
    env = orchestrator.run(
        _contract(tmp_path, image_id, script, fallback=True), _options(tmp_path, [])
    )
    assert env.status == "succeeded", (env.failure, env.exitCode)
    assert env.gpus == [] and env.gpuFallback


@pytest.mark.docker
def test_a_spec_that_cannot_be_applied_starts_nothing(tmp_path: Path, image_id: str) -> None:
    """A "device node" that is a regular file: gpu_unavailable before any container, the
    device lock released; with a CPU fallback the job runs without the GPU instead."""
    folder = _spec(tmp_path)
    spec = json.loads((folder / "nvidia.json").read_text())
    spec["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] = str(tmp_path / "cdi")
    (folder / "nvidia.json").write_text(json.dumps(spec))
    strict = orchestrator.run(
        _contract(tmp_path, image_id, "true", fallback=False), _options(tmp_path, TWO)
    )
    assert strict.failure is not None and strict.failure.category == "gpu_unavailable"
    assert "is not a device" in strict.failure.reason and strict.container is None
    assert gpus.Allocator(tmp_path / "locks", lambda _: True).holders() == {}
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "cdi").symlink_to(folder)
    loose = orchestrator.run(
        _contract(tmp_path / "b", image_id, "! ls /dev/nvidia* 2>/dev/null", fallback=True),
        _options(tmp_path / "b", TWO),
    )
    assert loose.status == "succeeded", (loose.failure, loose.exitCode)
    assert loose.gpus == [] and loose.gpuFallback and "is not a device" in loose.gpuFallback


@pytest.mark.docker
def test_native_cdi_asks_the_engine_by_name(image_id: str) -> None:
    """A cdi-native container asks for the device by CDI name (DeviceRequests, driver cdi);
    this engine (20.10, no CDI) accepts it at create and cannot start it: gpu_unavailable.
    An engine without CDI reports no CDI spec folders."""
    from dataclasses import replace

    from runner.backends.docker import DockerBackend
    from runner.backends.types import DeviceEdits
    from runner.core.errors import GpuUnavailable
    from tests.integration.test_engine_api import _spec
    from tests.support import docker

    backend = DockerBackend()
    assert backend.cdi_native() is False
    name = f"nvidia.com/gpu={TWO[0].uuid}"
    spec = replace(_spec(image_id, ["true"]), devices=DeviceEdits("cdi-native", (name,)))
    cid = backend.create(spec)
    try:
        host = json.loads(docker("inspect", cid).stdout)[0]["HostConfig"]
        (request,) = host["DeviceRequests"]
        assert (request["Driver"], request["DeviceIDs"]) == ("cdi", [name])
        assert not host["Devices"]
        with pytest.raises(GpuUnavailable, match="cdi") as refused:
            backend.start(cid)
        assert "CDI support" in (refused.value.hint or "")
    finally:
        backend.remove(cid)
