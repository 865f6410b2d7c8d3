"""GPU allotment on a GPU-less machine: selection, locking and fallback with the detection
layer faked; the engine's own behaviour without a GPU driver for real.

The tests that need no engine are in tests/unit/test_gpus.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.contract import Trust
from runner.execution import orchestrator
from runner.gpu import gpus
from runner.gpu.gpus import Gpu
from runner.planning import policy
from runner.state.ledger import read_state
from tests.support import SESSION_ID, SESSION_LABEL, docker, write_contract
from tests.unit.test_gpus import (
    FAKE,
)


class FakeDetector:
    def __init__(self, found: list[Gpu]) -> None:
        self.found = found

    def detect(self) -> list[Gpu]:
        return list(self.found)


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
