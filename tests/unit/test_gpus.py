"""GPU allotment on a GPU-less machine: selection, locking and fallback with the detection
layer faked; the engine's own behaviour without a GPU driver for real.

The tests that need the engine are in tests/integration/test_gpus.py."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.core.errors import GpuUnavailable
from runner.gpu import gpus
from runner.gpu.gpus import Allocator, Gpu, HostDetector, parse_smi
from tests.support import ROOT

FAKE = [
    Gpu(0, "GPU-00000000-fake-0000-0000-000000000000", "Fake H100", 80 * 1024**3, "550.54"),
    Gpu(1, "GPU-11111111-fake-1111-1111-111111111111", "Fake H100", 80 * 1024**3, "550.54"),
]


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


def test_without_nvml_binding_the_refusal_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML's binding is the [gpu] extra: on a host without it (``import pynvml`` fails, as
    where it is not installed) detection still asks nvidia-smi, and a GPU job's refusal names
    the extra to install; with the binding present the message does not."""
    assert gpus.nvml_binding_installed()  # the dev extra installs it
    allocator = Allocator(tmp_path, lambda holder: True)
    with pytest.raises(GpuUnavailable) as present:
        allocator.allocate(1, [], _owner("a"))
    assert "[gpu]" not in str(present.value)

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml: ImportError
    assert not gpus.nvml_binding_installed()
    assert HostDetector._nvml() is None  # so nvidia-smi is asked next
    with pytest.raises(GpuUnavailable, match="has none") as missing:
        allocator.allocate(1, [], _owner("a"))
    assert "pip install 'reproduction-runner[gpu]'" in missing.value.message


def test_without_nvml_binding_nvidia_smi_still_finds_the_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback: with no binding, a real ``nvidia-smi`` executable on PATH (a script here
    that prints what the real one prints) is what detection reports."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, GPU-abc, NVIDIA H100 80GB HBM3, 81559, 550.54.15'\n")
    smi.chmod(0o755)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    (gpu,) = HostDetector().detect()
    assert (gpu.uuid, gpu.driver_version) == ("GPU-abc", "550.54.15")


def test_this_machine_has_no_gpu() -> None:
    """Detection on this GPU-less machine answers zero GPUs rather than failing."""
    assert HostDetector().detect() == []


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
