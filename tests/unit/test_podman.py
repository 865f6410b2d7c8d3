"""Long on purpose: every test of the Podman backend in one place, from the pure decision to
real rootful and rootless Podman, so that what runs under Podman is read in one file.

The Podman backend: which caps it can enforce (pure logic, every combination of rootless or
rootful, cgroup v1 or v2, delegated controllers), the engine a host picks, and real Podman:
the toy and the hostile suite's core cases under rootful Podman, and `runner run` as an
unprivileged user with rootless Podman, refused on cgroup v1 with the cap named and nothing
created (run on cgroup v2, the same test expects the toy to succeed instead).

``scripts/setup_podman.sh`` prepares what these need (Podman, its rootful API service, the job
image in its store, the user ``runner-rootless``); anything missing fails, never skips.

The tests that need the engine are in tests/integration/test_podman.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runner import backends
from runner.backends import podman
from runner.backends.docker import DockerBackend
from runner.backends.fake import FakeBackend, FakeJob
from runner.backends.podman import PodmanBackend
from runner.backends.podmancaps import PodmanHost, refusal, unenforceable
from runner.backends.types import GIB, MIB, Limits
from runner.contract import Trust
from runner.core.errors import HostConfigError, PolicyViolation
from runner.execution import orchestrator
from runner.planning import policy
from tests.support import (
    write_contract,
)

# The image tests' loopback registry and pushed image, as fixtures of this module too.


def _limits(**changes: Any) -> Limits:
    base: dict[str, Any] = {
        "cpus": 2.0,
        "memory_bytes": 2 * GIB,
        "memory_swap_bytes": 2 * GIB,
        "shm_bytes": 64 * MIB,
        "pids": 512,
        "tmpfs_bytes": 64 * MIB,
        "gpus": "none",
        "network": "none",
        "timeout_seconds": 60.0,
    }
    return Limits(**{**base, **changes})


ALL = frozenset({"cpuset", "cpu", "cpuacct", "blkio", "memory", "devices", "freezer", "pids"})


def _host(rootless: bool, version: str, controllers: frozenset[str] = ALL) -> PodmanHost:
    return PodmanHost(rootless, "v2" if version == "v2" else "v1", controllers, "runc")


# ------------------------------------------------------------------ the decision (pure logic)


@pytest.mark.parametrize(
    ("host", "dropped"),
    [
        (_host(False, "v1"), []),
        (_host(False, "v2", frozenset({"cpu", "memory", "pids", "io"})), []),
        (_host(False, "v1", ALL - {"pids"}), ["pidsLimit"]),
        (_host(False, "v2", frozenset({"memory"})), ["cpus", "pidsLimit"]),
        (_host(True, "v1"), ["memory", "cpus", "pidsLimit"]),  # controllers listed or not
        (_host(True, "v1", frozenset()), ["memory", "cpus", "pidsLimit"]),
        (_host(True, "v2", frozenset({"cpu", "memory", "pids"})), []),
        (_host(True, "v2", frozenset({"memory", "pids"})), ["cpus"]),
        (_host(True, "v2", frozenset()), ["memory", "cpus", "pidsLimit"]),
    ],
    ids=[
        "rootful-v1",
        "rootful-v2",
        "rootful-v1-no-pids-controller",
        "rootful-v2-memory-only",
        "rootless-v1",
        "rootless-v1-nothing-listed",
        "rootless-v2-delegated",
        "rootless-v2-cpu-not-delegated",
        "rootless-v2-nothing-delegated",
    ],
)
def test_which_caps_each_engine_can_enforce(host: PodmanHost, dropped: list[str]) -> None:
    got = unenforceable(_limits(), host)
    assert [cap.split(":")[0] for cap, _ in got] == dropped
    assert (refusal(_limits(), host) is None) == (not dropped)


def test_no_pids_cap_needs_no_pids_controller_but_runsc_is_refused() -> None:
    """Under runsc the plan has no pids cap; runsc itself is refused (Podman's compatible API
    ran runc when asked for runsc, and runsc under Podman is not verified)."""
    host = _host(False, "v1", ALL - {"pids"})
    got = unenforceable(_limits(pids=None, runtime="runsc"), host)
    assert [cap for cap, _ in got] == ["runtime: runsc"]
    assert "another (runsc) has not been verified under Podman" in got[0][1]


@pytest.mark.parametrize(
    ("network", "refused"),
    [("none", False), ("bridge", False), ("egress", True), ("gateway", True)],
)
def test_only_no_network_and_the_bridge_are_offered(network: str, refused: bool) -> None:
    got = unenforceable(_limits(network=network), _host(False, "v1"))
    assert [cap for cap, _ in got] == ([f"network: {network}"] if refused else [])


def test_gpus_are_not_offered() -> None:
    got = unenforceable(_limits(gpus=1), _host(False, "v2", frozenset({"cpu", "memory", "pids"})))
    assert [cap for cap, _ in got] == ["gpus: 1"]


def test_refusal_names_the_cap_its_value_and_the_way_out() -> None:
    refused = refusal(_limits(), _host(True, "v1"))
    assert isinstance(refused, PolicyViolation)
    assert refused.message.startswith(
        "rootless Podman on cgroup v1 cannot enforce the memory cap (memory: 2 GiB) "
        "(nor cpus: 2, pidsLimit: 512): there it accepts memory, CPU and pids caps and "
        "silently ignores them"
    )
    assert "rather than run with a cap dropped" in refused.message
    assert refused.hint is not None and "Delegate=yes" in refused.hint
    one = refusal(_limits(), _host(True, "v2", frozenset({"memory", "pids"})))
    assert one is not None
    assert "cannot enforce the cpus cap (cpus: 2): the cpu cgroup controller is not " in str(one)


def test_podman_info_is_read_with_the_weaker_answer_for_what_is_missing() -> None:
    real = {
        "host": {
            "cgroupVersion": "v2",
            "cgroupControllers": ["cpu", "memory", "pids"],
            "ociRuntime": {"name": "crun"},
            "security": {"rootless": False},
        }
    }
    assert PodmanHost.from_info(real) == PodmanHost(
        False, "v2", frozenset({"cpu", "memory", "pids"}), "crun"
    )
    for odd in ({}, {"host": None}, {"host": {"security": "x", "cgroupControllers": "memory"}}):
        assert PodmanHost.from_info(odd) == PodmanHost(True, "v1", frozenset(), "")
        assert refusal(_limits(), PodmanHost.from_info(odd)) is not None


# ------------------------------------------------------------------ choosing the engine


def test_the_engine_comes_from_the_policy_then_runner_engine_then_detection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RUNNER_ENGINE", "podman")
    assert isinstance(backends.default("docker"), DockerBackend)
    assert not isinstance(backends.default("docker"), PodmanBackend)
    assert isinstance(backends.default("auto"), PodmanBackend)
    assert isinstance(backends.default(), PodmanBackend)
    monkeypatch.setenv("RUNNER_ENGINE", "lxc")
    with pytest.raises(HostConfigError, match="RUNNER_ENGINE is 'lxc'"):
        backends.default("auto")
    monkeypatch.delenv("RUNNER_ENGINE")
    monkeypatch.setattr(backends, "_DOCKER_SOCKET", "/nonexistent/docker.sock")
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setenv("CONTAINER_HOST", "unix:///nonexistent/podman.sock")
    assert backends.detect() == "podman"
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert backends.detect() == "docker"
    monkeypatch.delenv("DOCKER_HOST")
    monkeypatch.delenv("CONTAINER_HOST")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/nonexistent")
    monkeypatch.setattr(podman, "ROOTFUL_SOCKET", "/nonexistent/podman.sock")
    assert backends.detect() == "docker"  # no socket of either: Docker's error says so
    policy.HostPolicy.model_validate({"engine": "podman"})
    with pytest.raises(ValueError, match="engine"):
        policy.HostPolicy.model_validate({"engine": "lxc"})


def test_a_cap_the_engine_would_drop_stops_the_run_before_anything_exists(
    tmp_path: Path,
) -> None:
    """The orchestrator asks the engine before the job folder, the ledger or a container:
    a refusal is policy_violation at the plan stage, exit 3, and nothing was created."""
    fake = FakeBackend(jobs=FakeJob())
    info = fake.add_image()
    fake.fail["check_limits"] = refusal(_limits(), _host(True, "v1"))  # type: ignore[assignment]
    contract = write_contract(tmp_path, info.id)
    options = orchestrator.RunOptions(
        state_dir=tmp_path / "state",
        policy=policy.LoadedPolicy(policy.HostPolicy(acceptUnsigned=True).resolved(), "test"),
        trust=Trust(keys=[]),
    )
    env = orchestrator.as_json(orchestrator.run(contract, options, backend=fake))
    assert env["failure"]["category"] == "policy_violation"
    assert env["failure"]["stage"] == "plan"
    assert "cannot enforce the memory cap" in env["failure"]["reason"]
    assert [m for m, _ in fake.calls] == ["check_limits"]
    assert not (tmp_path / "state" / "jobs").exists() or not any(
        (tmp_path / "state" / "jobs").iterdir()
    )
