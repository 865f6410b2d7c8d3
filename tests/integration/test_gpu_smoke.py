"""The GPU smoke job (images/gpu-smoke, examples/gpu-smoke) on this GPU-less machine: the image
builds offline; without a driver the program says so cleanly (exit 3, evidence naming the
cause); and with a stand-in libcuda (tests/fixtures/cdi/fake_libcuda.c, the driver API done on
the CPU) injected by a CDI spec the runner applies, the whole chain runs: spec -> device node
and read-only library -> ctypes calls -> evidence -> parsers -> envelope. Only the GPU itself
is missing; scripts/gpu_e2e.sh runs the same contract on one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from runner.contract import Trust
from runner.execution import orchestrator
from runner.gpu.gpus import Gpu
from runner.planning import policy
from tests.support import ROOT, SESSION_ID, SESSION_LABEL, docker

IMAGE = "runner-gpu-smoke:local"
FIXTURES = Path(__file__).parents[1] / "fixtures" / "cdi"
H200 = Gpu(0, "GPU-5c8f3a21-7d4e-9b06-e1f2-3a4b5c6d7e8f", "NVIDIA H200", 150754820096, "580.95.05")


class Found:
    def detect(self) -> list[Gpu]:
        return [H200]


@pytest.fixture(scope="module")
def smoke_image() -> str:
    """images/gpu-smoke built with no network (layers cached after the first build)."""
    built = docker("build", "--network", "none", "-q", "-t", IMAGE, str(ROOT / "images/gpu-smoke"))
    assert built.returncode == 0, built.stderr
    return built.stdout.strip().splitlines()[-1]


def _pinned(tmp_path: Path, image_id: str) -> Path:
    from runner.contract import with_digest

    data = json.loads((ROOT / "examples/gpu-smoke/task.json").read_text())
    data["environment"]["image"] = image_id
    path = tmp_path / "task.json"
    path.write_text(
        json.dumps(with_digest({k: v for k, v in data.items() if k != "contractDigest"}))
    )
    return path


@pytest.mark.docker
def test_the_image_is_small_and_says_no_driver_cleanly(smoke_image: str, tmp_path: Path) -> None:
    """Under the runner's hardening and no driver: exit 3, 'no driver' in the evidence."""
    size = json.loads(docker("image", "inspect", smoke_image).stdout)[0]["Size"]
    assert size < 48 * 1024**2, f"{size:,} bytes: too big to travel with the engine"
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    run = docker(
        "run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges", "--label", f"{SESSION_LABEL}={SESSION_ID}",
        "-v", f"{out}:/job/output", smoke_image,
    )  # fmt: skip
    assert run.returncode == 3, (run.stdout, run.stderr)
    assert "gpu-smoke: no driver: libcuda.so.1 cannot be loaded" in run.stderr
    evidence = json.loads((out / "gpu-smoke.json").read_text())
    assert evidence["kernelCheck"] is False and evidence["exitCode"] == 3
    assert evidence["nvidiaSmi"] == "nvidia-smi: not found"


@pytest.mark.docker
def test_the_contract_runs_through_an_applied_cdi_spec(smoke_image: str, tmp_path: Path) -> None:
    """The stand-in driver reaches the job only through the spec (device node, read-only
    library, LD_LIBRARY_PATH): every measurement parses, the envelope records cdi-applied."""
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(FIXTURES / "fake_libcuda.c")],
        check=True,
    )
    specs = tmp_path / "cdi"
    specs.mkdir()
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": H200.uuid, "containerEdits": {"deviceNodes": [
            {"path": "/dev/nvidia0", "hostPath": "/dev/full"}]}}],
        "containerEdits": {
            "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": "/dev/null"}],
            "mounts": [{"hostPath": str(lib), "options": ["ro", "nosuid", "nodev", "bind"],
                        "containerPath": "/usr/local/nvidia/lib64/libcuda.so.1"}],
            "env": ["LD_LIBRARY_PATH=/usr/local/nvidia/lib64"],
        },
    }  # fmt: skip
    (specs / "nvidia.json").write_text(json.dumps(spec))
    options = orchestrator.RunOptions(
        state_dir=tmp_path / "state",
        policy=policy.LoadedPolicy(policy.HostPolicy(acceptUnsigned=True).resolved(), "test"),
        trust=Trust(keys=[]),
        labels={SESSION_LABEL: SESSION_ID},
        gpu_detector=Found(),
        gpu_lock_dir=tmp_path / "locks",
        cdi_dirs=(specs,),
    )
    env = orchestrator.run(_pinned(tmp_path, smoke_image), options)
    assert env.status == "succeeded", (env.failure, env.exitCode)
    values = {m.measurementId: m.value for m in env.measurements}
    assert values["gpu-kernel-check"] is True
    assert values["gpu-device-name"] == "Fake CUDA Device (CPU)"
    assert values["gpu-device-count"] == 1
    bandwidth = values["gpu-h2d-bandwidth"]
    assert isinstance(bandwidth, float) and bandwidth > 0
    (gpu,) = env.gpus
    assert (gpu.injection, gpu.cdiDevice) == ("cdi-applied", f"nvidia.com/gpu={H200.uuid}")
