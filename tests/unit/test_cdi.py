"""CDI specs without an engine: generation for an H200 with driver 580 from captured NVML and
loader-cache reports, the checks against the schema and the declared version, the folders
they are read from, the refusals of a spec the runner cannot apply, and the choice of how a
GPU reaches the container."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from runner.backends.fake import FakeBackend
from runner.core.errors import GpuUnavailable
from runner.gpu import cdi
from runner.gpu.gpus import Gpu
from tests.support.jobs import run_cli

FIXTURES = Path(__file__).parents[1] / "fixtures" / "cdi"
LDCACHE = (FIXTURES / "ldconfig-h200.txt").read_text()
REPORT = json.loads((FIXTURES / "nvml-h200.json").read_text())
H200 = [Gpu(**g) for g in REPORT["gpus"]]
DRIVER = REPORT["driverVersion"]
UUID = H200[0].uuid
LIB = "/usr/local/nvidia/lib64"


def driver_root(tmp_path: Path) -> Path:
    """The device machine's driver files (empty stand-ins) under ``tmp_path``."""
    tree = json.loads((FIXTURES / "driver-tree.json").read_text())
    root = tmp_path / "root"
    for name in tree["files"]:
        path = root / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    for name, target in tree["links"].items():
        path = root / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
    return root


def h200_spec(tmp_path: Path) -> dict[str, Any]:
    root = driver_root(tmp_path)
    return cdi.generate(H200, DRIVER, LDCACHE, root=root, smi="/usr/bin/nvidia-smi")


def test_the_loader_cache_is_read_64_bit_only() -> None:
    entries = cdi.parse_ldcache(LDCACHE)
    assert ("libcuda.so.1", f"{LIB}/libcuda.so.1") in [(e.name, e.path) for e in entries]
    assert not any(e.path.startswith("/usr/lib32/") for e in entries)
    assert len(entries) == 18  # every 64-bit line, the header and the 32-bit libcuda left out


def test_generated_spec_for_an_h200_with_driver_580(tmp_path: Path) -> None:
    """One device by index, one by UUID, and all; the control nodes; the driver's libraries
    of this driver version only, read-only, under their loader-cache names and their own;
    nvidia-smi; the library folder on LD_LIBRARY_PATH."""
    spec = h200_spec(tmp_path)
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == "nvidia.com/gpu"
    names = [d["name"] for d in spec["devices"]]
    assert names == ["0", UUID, "all"]
    for device in spec["devices"]:
        assert device["containerEdits"] == {"deviceNodes": [{"path": "/dev/nvidia0"}]}
    edits = spec["containerEdits"]
    assert [n["path"] for n in edits["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    real = f"{LIB}/libcuda.so.{DRIVER}"
    assert mounts[f"{LIB}/libcuda.so.1"] == real and mounts[real] == real
    assert mounts[f"{LIB}/libcuda.so"] == real
    for lib in ("libnvidia-ml", "libnvidia-ptxjitcompiler", "libnvidia-nvvm", "libcudadebugger"):
        assert mounts[f"{LIB}/{lib}.so.{DRIVER}"] == f"{LIB}/{lib}.so.{DRIVER}"
    assert mounts["/usr/bin/nvidia-smi"] == "/usr/local/nvidia/bin/nvidia-smi"
    assert all(m["options"][0] == "ro" for m in edits["mounts"])
    # Not the driver's: a stale 570 libnvidia-ml, a 32-bit libcuda, Wayland's EGL, CUDA's runtime.
    hosts = {m["hostPath"] for m in edits["mounts"]}
    assert not any("570." in h or "lib32" in h or "wayland" in h or "cudart" in h for h in hosts)
    assert "LD_LIBRARY_PATH=/usr/local/nvidia/lib64" in edits["env"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in edits["env"]
    cdi.check(spec, "generated")  # it passes its own checks


def test_generated_spec_round_trips_through_yaml_and_json(tmp_path: Path) -> None:
    spec = h200_spec(tmp_path)
    for fmt, name in (("yaml", "nvidia.yaml"), ("json", "nvidia.json")):
        got = cdi.parse(cdi.dump(spec, fmt).encode(), name)
        assert got.raw == spec and got.devices[UUID] == spec["devices"][1]["containerEdits"]


def test_a_device_node_per_minor_number_not_index(tmp_path: Path) -> None:
    """NVML's minor number names the node: GPU index 1 may be /dev/nvidia3."""
    two = [H200[0], Gpu(1, "GPU-aaaa", "NVIDIA H200", 1, DRIVER, minor=3)]
    spec = cdi.generate(two, DRIVER, LDCACHE, root=driver_root(tmp_path))
    by_name = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    assert by_name["1"] == by_name["GPU-aaaa"] == [{"path": "/dev/nvidia3"}]
    assert by_name["all"] == [{"path": "/dev/nvidia0"}, {"path": "/dev/nvidia3"}]


def test_no_driver_libraries_is_a_clear_refusal(tmp_path: Path) -> None:
    with pytest.raises(GpuUnavailable, match=r"libcuda\.so and libnvidia-ml\.so for driver 590"):
        cdi.generate(H200, "590.1", LDCACHE, root=driver_root(tmp_path))
    with pytest.raises(GpuUnavailable, match="no GPU to write a CDI spec for"):
        cdi.generate([], DRIVER, LDCACHE)


def test_a_library_folder_outside_the_loader_cache_is_searched(tmp_path: Path) -> None:
    """The device machine's /usr/local/nvidia/lib64 need not be in ld.so.conf."""
    spec = cdi.generate(H200, DRIVER, "", root=driver_root(tmp_path))
    targets = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    assert {f"{LIB}/libcuda.so.1", f"{LIB}/libnvidia-ml.so.1"} <= targets


def test_a_driver_folder_of_plain_copies_is_taken(tmp_path: Path) -> None:
    """A driver folder whose libraries are copies under their sonames (no versioned file, as
    some device plugins lay them out) is the driver's; another version's file is not."""
    folder = tmp_path / "usr/local/nvidia/lib64"
    folder.mkdir(parents=True)
    for name in ("libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-cfg.so.570.1.2"):
        (folder / name).write_bytes(b"")
    spec = cdi.generate(H200, DRIVER, "", root=tmp_path)
    hosts = sorted(m["hostPath"] for m in spec["containerEdits"]["mounts"])
    assert hosts == [f"{LIB}/libcuda.so.1", f"{LIB}/libnvidia-ml.so.1"]


def _minimal(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}],
    }
    spec.update(changes)
    return spec


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (_minimal(cdiVersion="2.0.0"), "cdiVersion '2.0.0' is not one this runner knows"),
        (_minimal(cdiVersion="0.4.0"), "uses fields of CDI 0.5.0 but declares cdiVersion 0.4.0"),
        (_minimal(annotations={"a": "b"}), "uses fields of CDI 0.6.0"),
        (_minimal(devices=[{"name": "0"}]), "does not match the CDI schema at devices/0"),
        (_minimal(kind="gpu"), "kind 'gpu' is not vendor/class"),
        (
            _minimal(devices=[{"name": "-x", "containerEdits": {}}]),
            "device name '-x' is not a CDI device name",
        ),
        (
            _minimal(devices=[{"name": "a", "containerEdits": {}}] * 2),
            "names the device 'a' twice",
        ),
        (_minimal(containerEdits={"env": [7]}), "does not match the CDI schema"),
        ([], "does not match the CDI schema at (top)"),
    ],
)
def test_a_spec_is_checked_against_its_declared_version(spec: Any, message: str) -> None:
    with pytest.raises(GpuUnavailable) as caught:
        cdi.check(spec, "/etc/cdi/x.json")
    assert message in caught.value.message and "/etc/cdi/x.json" in caught.value.message


def test_the_newest_version_a_field_needs() -> None:
    assert cdi.required_version(_minimal(devices=[{"name": "a", "containerEdits": {}}])) == "0.3.0"
    typed = {"mounts": [{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]}
    assert cdi.required_version(_minimal(devices=[], containerEdits=typed)) == "0.4.0"
    assert cdi.required_version(_minimal(containerEdits={"additionalGids": [5]})) == "0.7.0"
    net = {"netDevices": [{"hostInterfaceName": "a", "name": "b"}]}
    assert cdi.required_version(_minimal(containerEdits=net)) == "1.1.0"


def test_specs_are_read_from_both_folders_the_later_wins(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    etc.mkdir()
    run.mkdir()
    (etc / "a.json").write_text(json.dumps(_minimal()))
    later = _minimal(devices=[{"name": "0", "containerEdits": {"env": ["X=1"]}}])
    (run / "b.yaml").write_text(cdi.dump(later, "yaml"))
    (etc / "notes.txt").write_text("not a spec")
    specs = cdi.find([etc, run, tmp_path / "missing"])
    assert [Path(s.source).name for s in specs] == ["a.json", "b.yaml"]
    assert cdi.registry(specs)["nvidia.com/gpu=0"][1] == {"env": ["X=1"]}


@pytest.mark.hostile
def test_a_spec_file_that_is_not_a_small_regular_file_is_refused(tmp_path: Path) -> None:
    """A FIFO is refused without blocking, a folder and an oversized file by name."""
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(GpuUnavailable, match=r"fifo\.json.*not a regular file"):
        cdi.find([tmp_path])
    os.unlink(tmp_path / "fifo.json")
    (tmp_path / "big.json").write_bytes(b" " * (cdi.MAX_SPEC_BYTES + 1))
    with pytest.raises(GpuUnavailable, match=r"big\.json"):
        cdi.find([tmp_path])
    os.unlink(tmp_path / "big.json")
    (tmp_path / "bad.yaml").write_text("cdiVersion: [unclosed\n")
    with pytest.raises(GpuUnavailable, match=r"bad\.yaml: is not valid YAML"):
        cdi.find([tmp_path])
    (tmp_path / "bad.yaml").write_text("!!python/object/apply:os.system ['true']\n")
    with pytest.raises(GpuUnavailable, match="not valid YAML"):  # safe_load: no objects
        cdi.find([tmp_path])


def _spec_with(edits: dict[str, Any], version: str = "0.5.0") -> cdi.Spec:
    data = {
        "cdiVersion": version,
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": edits}],
    }
    return cdi.check(data, "test.json")


def test_applied_edits_are_the_spec_own(tmp_path: Path) -> None:
    lib = tmp_path / "libcuda.so.1"
    lib.write_bytes(b"")
    spec = _spec_with(
        {
            "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/full", "permissions": "rw"}],
            "mounts": [{"hostPath": str(lib), "containerPath": "/drv/libcuda.so.1"}],
            "env": ["LD_LIBRARY_PATH=/drv", "EMPTY="],
        }
    )
    edits = cdi.apply([spec], ["nvidia.com/gpu=0"])
    assert edits.mode == "cdi-applied" and edits.cdi_devices == ("nvidia.com/gpu=0",)
    assert [(n.host_path, n.container_path, n.permissions) for n in edits.nodes] == [
        ("/dev/full", "/dev/nvidia0", "rw")
    ]
    assert edits.mounts == ((str(lib), "/drv/libcuda.so.1"),)
    assert edits.env == (("LD_LIBRARY_PATH", "/drv"), ("EMPTY", ""))


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("edits", "message"),
    [
        ({"deviceNodes": [{"path": "dev/nvidia0"}]}, "'dev/nvidia0' is not an absolute path"),
        ({"deviceNodes": [{"path": "/dev/../etc/shadow"}]}, "without '..'"),
        ({"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/etc/hostname"}]}, "not a device"),
        ({"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev"}]}, "not a device"),
        ({"deviceNodes": [{"path": "/dev/nvidia9"}]}, "/dev/nvidia9 cannot be found"),
        (
            {"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/null", "permissions": "rwx"}]},
            "permissions 'rwx'",
        ),
        ({"mounts": [{"hostPath": "lib", "containerPath": "/lib"}]}, "'lib' is not an absolute"),
        ({"mounts": [{"hostPath": "/nonexistent-lib", "containerPath": "/l"}]}, "does not exist"),
        (
            {"mounts": [{"hostPath": "/etc", "containerPath": "/x", "type": "tmpfs"}]},
            "type 'tmpfs'",
        ),
        ({"hooks": [{"hookName": "createContainer", "path": "/bin/true"}]}, "needs hooks"),
        ({"env": ["NOT A NAME=1"]}, "is not NAME=value"),
    ],
)
def test_a_spec_the_runner_cannot_apply_is_refused(edits: dict[str, Any], message: str) -> None:
    with pytest.raises(GpuUnavailable) as caught:
        cdi.apply([_spec_with(edits)], ["nvidia.com/gpu=0"])
    assert message in caught.value.message


def test_a_device_no_spec_names_is_refused() -> None:
    spec = _spec_with({"deviceNodes": [{"path": "/dev/null"}]})
    with pytest.raises(GpuUnavailable, match=r"no CDI spec names the device nvidia\.com/gpu=1"):
        cdi.apply([spec], ["nvidia.com/gpu=1"])


def _spec_dir(tmp_path: Path, spec: dict[str, Any]) -> Path:
    folder = tmp_path / "cdi"
    folder.mkdir(exist_ok=True)
    (folder / "nvidia.json").write_text(json.dumps(spec))
    return folder


def test_how_a_gpu_reaches_the_container(tmp_path: Path) -> None:
    """Native CDI where the engine has it and a spec names the GPU (by UUID first); else the
    NVIDIA runtime where the engine has one; else the runner applies the spec."""
    spec = _minimal(
        devices=[
            {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/null"}]}},
            {"name": UUID, "containerEdits": {"deviceNodes": [{"path": "/dev/null"}]}},
        ]
    )
    folder = _spec_dir(tmp_path, spec)
    native = cdi.inject(FakeBackend(cdi=True, gpus=True), H200, [folder])
    assert native.mode == "cdi-native" and native.cdi_devices == (f"nvidia.com/gpu={UUID}",)
    assert not native.nodes and not native.mounts
    runtime = cdi.inject(FakeBackend(gpus=True), H200, [folder])
    assert runtime.mode == "nvidia-runtime" and runtime.cdi_devices == ()
    applied = cdi.inject(FakeBackend(), H200, [folder])
    assert applied.mode == "cdi-applied"
    assert [n.container_path for n in applied.nodes] == ["/dev/null"]
    # The NVIDIA runtime's path reads no spec: a broken one does not stand in its way.
    (folder / "broken.yaml").write_text("cdiVersion: [")
    assert cdi.inject(FakeBackend(gpus=True), H200, [folder]).mode == "nvidia-runtime"
    with pytest.raises(GpuUnavailable, match=r"broken\.yaml"):
        cdi.inject(FakeBackend(), H200, [folder])


def test_without_a_spec_one_is_generated_and_applied(tmp_path: Path) -> None:
    """No spec in the folders and no toolkit: the generator's spec is applied (even on an
    engine with CDI, which has no spec to read)."""
    made: list[list[Gpu]] = []

    def make(chosen: Any) -> dict[str, Any]:
        made.append(list(chosen))
        spec = _minimal()
        spec["devices"][0]["containerEdits"]["deviceNodes"] = [
            {"path": "/dev/nvidia0", "hostPath": "/dev/zero"}
        ]
        return spec

    edits = cdi.inject(FakeBackend(cdi=True), H200, [tmp_path / "none"], make)
    assert made == [H200] and edits.mode == "cdi-applied"
    assert edits.cdi_devices == ("nvidia.com/gpu=0",)
    broken = copy.deepcopy(_minimal(devices=[{"name": "7", "containerEdits": {}}]))
    with pytest.raises(GpuUnavailable, match="does not name the GPUs allotted"):
        cdi.inject(FakeBackend(), H200, [tmp_path / "none"], lambda _: broken)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("gpu", "cdi", *args, timeout=60)


def test_cli_writes_the_spec_from_a_captured_report(tmp_path: Path) -> None:
    """`runner gpu cdi` with the H200 report, its loader cache and driver files: the spec
    written as YAML (no aliases), then found as the description of that GPU."""
    root = driver_root(tmp_path)
    specs = tmp_path / "specs"
    specs.mkdir()
    report = ["--report", str(FIXTURES / "nvml-h200.json")]
    given = [*report, "--ldcache", str(FIXTURES / "ldconfig-h200.txt"), "--driver-root", str(root)]
    out = _cli(*given, "--spec-dir", str(specs), "--output", str(specs / "nvidia.yaml"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"wrote {specs / 'nvidia.yaml'}: nvidia.com/gpu=0, ")
    text = (specs / "nvidia.yaml").read_text()
    assert "&id" not in text and "*id" not in text
    (spec,) = cdi.find([specs])
    assert spec.raw == h200_spec(tmp_path / "again")
    again = _cli(*report, "--spec-dir", str(specs), "--json")
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["written"] is None and summary["devices"] == [f"nvidia.com/gpu={UUID}"]
    assert summary["existing"] == [str(specs / "nvidia.yaml")]
    forced = _cli(*given, "--spec-dir", str(specs), "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["spec"]["kind"] == "nvidia.com/gpu"


def test_cli_on_this_gpu_less_machine_and_with_bad_input(tmp_path: Path) -> None:
    none = _cli("--spec-dir", str(tmp_path))
    assert none.returncode == 4 and "no GPU to write a CDI spec for" in none.stderr
    report = tmp_path / "in" / "r.json"
    report.parent.mkdir()
    report.write_text('{"gpus": [{"index": 0}]}')
    bad = _cli("--report", str(report), "--spec-dir", str(tmp_path / "none"))
    assert bad.returncode == 2 and "not a detection report" in bad.stderr
    nowhere = _cli(
        "--report", str(FIXTURES / "nvml-h200.json"), "--ldcache",
        str(FIXTURES / "ldconfig-h200.txt"), "--driver-root", str(driver_root(tmp_path)),
        "--spec-dir", str(tmp_path / "none"), "--output", str(tmp_path / "no" / "such" / "x.yaml"),
    )  # fmt: skip
    assert nowhere.returncode == 2 and "cannot write there" in nowhere.stderr


def test_the_host_folders_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """RUNNER_CDI_DIRS (and RUNNER_GPU_LOCK_DIR, which failed with a NameError before)."""
    from runner.app import host

    monkeypatch.setenv("RUNNER_CDI_DIRS", "/a/cdi::/b/cdi")
    monkeypatch.setenv("RUNNER_GPU_LOCK_DIR", "/a/locks")
    assert host.cdi_dirs() == (Path("/a/cdi"), Path("/b/cdi"))
    assert host.gpu_lock_dir() == Path("/a/locks")
    monkeypatch.delenv("RUNNER_CDI_DIRS")
    assert host.cdi_dirs() is None
