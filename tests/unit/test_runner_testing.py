"""runner.testing, the public helpers for those who embed the runner (and for its benchmarks):
every exported name imports, the tests' support re-exports the same objects (one owner), and
its fake backend runs a job written by its contract writer through the real orchestrator."""

from __future__ import annotations

import importlib
from pathlib import Path

import runner.testing
from runner.contract import Trust
from runner.execution import orchestrator
from runner.gpu.gpus import Gpu
from runner.planning import policy
from runner.state.ledger import read_state
from runner.testing import FakeBackend, FakeJob, json_measurement, write_contract


class _NoGpus:
    def detect(self) -> list[Gpu]:
        return []


def test_every_exported_name_imports() -> None:
    missing = [name for name in runner.testing.__all__ if not hasattr(runner.testing, name)]
    assert missing == []
    namespace: dict[str, object] = {}
    exec("from runner.testing import *", namespace)  # noqa: S102 - the star import's own names
    assert set(namespace) - {"__builtins__"} == set(runner.testing.__all__)


def test_the_tests_use_the_same_helpers() -> None:
    """tests.support re-exports runner.testing's objects rather than keeping copies."""
    support = importlib.import_module("tests.support")
    agents = importlib.import_module("tests.support.agents")
    egress = importlib.import_module("tests.support.egress")
    for module, names in (
        (
            support,
            [
                "IMAGE",
                "TOY",
                "copy_toy_inputs",
                "docker",
                "json_measurement",
                "toy_data",
                "write_contract",
            ],
        ),
        (agents, ["SCRIPTED_ARGV", "SCRIPTED_RUNTIME", "agent_contract", "agent_policy"]),
        (egress, ["Outside", "outside", "left_behind"]),
    ):
        for name in names:
            assert getattr(module, name) is getattr(runner.testing, name), (module, name)


def test_the_fake_backend_runs_a_job(tmp_path: Path) -> None:
    """A contract from write_contract, a fake image and a fake container that writes the
    evidence: the orchestrator runs it to `succeeded` with the measured value."""

    def work(mounts: dict[str, Path]) -> None:
        (mounts["/job/output"] / "result.json").write_text('{"accuracy": 0.5}')

    fake = FakeBackend(jobs=FakeJob(work=work))
    image = fake.add_image()
    contract = write_contract(
        tmp_path / "contract",
        image.id,
        command=["python3", "-c", "pass"],
        measurements=[json_measurement("result.json", "/accuracy")],
    )
    loaded = policy.LoadedPolicy(policy.HostPolicy(acceptUnsigned=True).resolved(), "test")
    options = orchestrator.RunOptions(
        state_dir=tmp_path / "state",
        policy=loaded,
        trust=Trust(keys=[]),
        tick_seconds=0.01,
        heartbeat_seconds=0.05,
        stop_grace_seconds=0.05,
        gpu_detector=_NoGpus(),
    )
    envelope = orchestrator.as_json(orchestrator.run(contract, options, backend=fake))
    assert envelope["status"] == "succeeded", envelope["failure"]
    assert envelope["measurements"][0]["value"] == 0.5
    assert fake.containers == {}  # removed once its end was in the ledger
    assert read_state(Path(envelope["jobDir"]) / "record" / "ledger.jsonl").finished is not None
