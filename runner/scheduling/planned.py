"""A contract checked and planned exactly as `runner run` would check and plan it, with its
job's ledger: what a submission to Slurm (``slurm.batch.prepare``) and a rendering for
Kubernetes (``kubernetes.plan.rendered``) both start from, before anything is sent.

The checks are `runner run`'s: signature, digest, schema (:func:`load_contract`), the job id
and whether the host lets the contract choose it, the execution mode, the host policy, and
the validity times unless the job's ledger accepted this very contract already (a job this
host accepted may be resumed after its contract expires, as `runner run` resumes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from runner.contract import Trust, VerifiedContract, load_contract
from runner.planning import plan, policy
from runner.planning.plan import ExecutionPlan
from runner.planning.policy import HostPolicy
from runner.state.jobdir import StateDir
from runner.state.ledger import LedgerState, read_state

__all__ = ["planned"]


@dataclass(frozen=True)
class Planned:
    """The verified contract, its plan, and its job's ledger (None before it is accepted)."""

    contract: VerifiedContract
    plan: ExecutionPlan
    state: LedgerState | None


def planned(
    path: Path,
    rules: HostPolicy,
    trust: Trust,
    state_dir: Path,
    *,
    job_id: str | None,
    host_uid: int,
    host_gid: int,
) -> Planned:
    """Verify the contract at ``path`` and check it against ``rules`` as `runner run` does,
    read its job's ledger under ``state_dir``, and plan it for a runner of ``host_uid`` and
    ``host_gid`` (as :func:`runner.planning.plan.build` uses them)."""
    contract = load_contract(path, trust)
    chosen = plan.job_id_for(contract, job_id, allow_override=rules.allowJobIdOverride)
    ledger_path = StateDir(state_dir).job(chosen).ledger
    state = read_state(ledger_path) if ledger_path.is_file() else None
    accepted = state.accepted if state is not None else None
    resuming = accepted is not None and accepted.get("contractDigest") == contract.digest
    plan.check_mode(contract, rules)
    policy.check(contract, rules, datetime.now(UTC), check_times=not resuming)
    built = plan.build(contract, rules, job_id=chosen, host_uid=host_uid, host_gid=host_gid)
    return Planned(contract, built, state)
