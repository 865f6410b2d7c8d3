"""A contract's Kubernetes manifests, checked as `runner run` checks the contract: what
`runner render --to kubernetes` prints and what
:func:`runner.scheduling.kubernetes.apply.submit` applies.

Reads the contract and the job's ledger (for the budget left); renders with the pure
:mod:`runner.scheduling.kubernetes.render`; contacts no cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from runner.contract import Trust
from runner.core.errors import InfrastructureError, PolicyViolation
from runner.planning.plan import ExecutionPlan
from runner.planning.policy import LoadedPolicy
from runner.scheduling import submissions
from runner.scheduling.kubernetes import attempts, render
from runner.scheduling.kubernetes.render import Manifest
from runner.scheduling.planned import planned
from runner.state.jobdir import StateDir
from runner.state.ledger import LedgerState

__all__ = ["Rendered", "check_staged", "last_submission", "record_submission", "rendered"]


@dataclass(frozen=True)
class Rendered:
    """A contract's manifests for one job, and what they were rendered from."""

    plan: ExecutionPlan
    contract_digest: str
    manifests: list[Manifest]
    deadline: int
    state: LedgerState | None
    namespace: str | None
    claim: str
    runtime_class: str

    @property
    def name(self) -> str:
        return str(self.manifests[0]["metadata"]["name"])


def rendered(
    contract_path: Path,
    loaded: LoadedPolicy,
    trust: Trust,
    *,
    state_dir: Path,
    job_id: str | None = None,
    namespace: str | None = None,
    claim: str = render.DEFAULT_CLAIM,
    runtime_class: str = render.DEFAULT_RUNTIME_CLASS,
) -> Rendered:
    """Check the contract and the policy as `runner run` does, plan the job as `runner run`
    as root plans it (user 10001), and render its manifests with the budget its ledger under
    ``state_dir`` leaves (else the contract's whole budget). Refuses a job whose last
    Kubernetes attempt has no recorded end, and one with no budget left
    (:func:`runner.scheduling.kubernetes.attempts.refuse`)."""
    if namespace is not None:
        render.check_name("--namespace", namespace)
    render.check_name("--claim", claim, subdomain=True)
    render.check_name("--runtime-class", runtime_class, subdomain=True)
    got = planned(
        contract_path, loaded.policy, trust, state_dir, job_id=job_id, host_uid=0, host_gid=0
    )
    contract, p, state = got.contract, got.plan, got.state
    render.refuse_unsupported(contract, p)
    ledger_path = StateDir(state_dir).job(p.job_id).ledger
    attempts.refuse(state, p.job_id, ledger_path, p.limits.timeout_seconds)
    deadline = render.deadline_seconds(p, state)
    manifests = render.render(
        p,
        deadline=deadline,
        namespace=namespace,
        claim=claim,
        runtime_class=runtime_class,
        attempt=len(state.attempts) + 1 if state is not None else 1,
    )
    return Rendered(p, contract.digest, manifests, deadline, state, namespace, claim, runtime_class)


def check_staged(r: Rendered, state_dir: Path) -> None:
    """Refuse a job whose folder under ``state_dir`` was not laid out for this contract (by
    `runner stage`, or `runner run`): the pod would find no inputs, or another's."""
    job = StateDir(state_dir).job(r.plan.job_id)
    hint = f"run `runner stage CONTRACT --state-dir {state_dir}` on a host that mounts the claim"
    accepted = r.state.accepted if r.state is not None else None
    if accepted is None or not (job.execution / "input-manifest.json").is_file():
        raise PolicyViolation(
            f"job {r.plan.job_id} is not staged under {state_dir}: the pod would start "
            "without its inputs",
            hint=hint,
        )
    if accepted.get("contractDigest") != r.contract_digest:  # deadline_seconds refuses it too
        raise PolicyViolation(f"job {r.plan.job_id} is staged for another contract", hint=hint)


def record_dir(state_dir: Path, job_id: str) -> Path:
    """``<state>/kubernetes/<job id>``: where `runner submit --to kubernetes` records it."""
    return submissions.folder(state_dir, "kubernetes", job_id)


def record_submission(state_dir: Path, submitted: dict[str, Any]) -> dict[str, Any]:
    """Append what `runner wait` and `runner cancel` need to find the Job again (the
    namespace, the context and kubeconfig, the names) to ``submissions.jsonl``."""
    entry = {
        "to": "kubernetes",
        "submittedAt": datetime.now(UTC).isoformat(timespec="seconds"),
        **{k: submitted[k] for k in ("jobId", "contractDigest", "name", "namespace", "context")},
        "kubeconfig": submitted.get("kubeconfig"),
        "objects": [(a.get("kind"), a.get("action")) for a in submitted.get("applied", [])],
    }
    return submissions.append(state_dir, "kubernetes", str(submitted["jobId"]), entry)


def last_submission(state_dir: Path, job_id: str) -> dict[str, Any] | None:
    """The job's latest Kubernetes submission from ``state_dir``, or None."""
    data = submissions.latest(state_dir, "kubernetes", job_id)
    if data is not None and data.get("to") != "kubernetes":
        path = record_dir(state_dir, job_id) / submissions.FILE
        raise InfrastructureError(f"{path}: its last line is not a Kubernetes submission")
    return data
