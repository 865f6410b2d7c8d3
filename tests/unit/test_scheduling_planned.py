"""runner/scheduling/planned.py, what a Slurm submission and a Kubernetes rendering both start
from: the contract checked and planned as `runner run` would, with its job's ledger. No
cluster: Slurm's request is built without asking Slurm (no GPU types offered)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from runner.app import host
from runner.core.errors import ContractError, JobAlreadyFinished
from runner.scheduling.kubernetes import plan
from runner.scheduling.planned import planned
from runner.scheduling.slurm import batch
from runner.state.ledger import Ledger
from tests.support import write_contract

IMAGE = "registry.example/runner-cpu@sha256:" + "ab" * 32


def test_both_clusters_plan_the_same_job_for_their_own_runner(tmp_path: Path) -> None:
    contract = write_contract(tmp_path / "c", IMAGE)
    loaded, trust = host.load(allow_unsigned=True)
    state = tmp_path / "state"
    here = planned(contract, loaded.policy, trust, state, job_id=None,
                   host_uid=os.getuid(), host_gid=os.getgid())  # fmt: skip
    assert here.state is None, "no ledger yet"
    req = batch.prepare(contract, loaded.policy, trust, state, job_id=None, stop_grace=5,
                        ceiling=None, offered=[])  # fmt: skip
    assert req.jobId == here.plan.job_id and req.contractDigest == here.contract.digest
    assert req.contractSha256 == hashlib.sha256(contract.read_bytes()).hexdigest()
    assert req.budgetSeconds == here.plan.limits.timeout_seconds
    r = plan.rendered(contract, loaded, trust, state_dir=state)
    assert r.plan.job_id == here.plan.job_id and r.contract_digest == here.contract.digest
    assert r.plan.limits == here.plan.limits
    assert r.plan.user.startswith("10001"), "planned as `runner run` as root plans it"


def test_the_ledger_is_read_and_another_contract_under_the_job_id_is_refused(
    tmp_path: Path,
) -> None:
    contract = write_contract(tmp_path / "c", IMAGE)
    loaded, trust = host.load(allow_unsigned=True)
    state = tmp_path / "state"
    ledger_path = state / "jobs" / "shared" / "record" / "ledger.jsonl"
    ledger_path.parent.mkdir(parents=True)
    data = {"jobId": "shared", "contractDigest": "sha256:" + "0" * 64, "limitSeconds": 60}
    Ledger.open(ledger_path).append("job.accepted", "job.accepted", data)
    with pytest.raises(JobAlreadyFinished, match="another contract"):
        batch.prepare(contract, loaded.policy, trust, state, job_id="shared", stop_grace=5,
                      ceiling=None, offered=[])  # fmt: skip
    got = planned(contract, loaded.policy, trust, state, job_id="shared", host_uid=0, host_gid=0)
    assert got.state is not None and got.state.accepted is not None


def test_a_contract_that_is_not_one_is_refused_before_any_plan(tmp_path: Path) -> None:
    bad = tmp_path / "task.json"
    bad.write_text('{"name": "x"}')
    loaded, trust = host.load(allow_unsigned=True)
    with pytest.raises(ContractError):
        planned(bad, loaded.policy, trust, tmp_path / "state", job_id=None, host_uid=0,
                host_gid=0)  # fmt: skip
