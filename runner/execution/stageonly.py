"""Stage a job and run nothing (`runner stage`): the job folder laid out exactly as `runner run`
lays it out before it creates a container, for a runner (or a cluster's pod) to run later.

:func:`stage` checks the contract and the host policy as `runner run` does, plans the job for
this host's user, then, under the job folder's lock: accepts the job in its ledger (or checks
that the ledger's job is this contract's, unfinished, with no attempt in flight and budget
left), stages and verifies the inputs (``input/``, the input cache as `runner run` uses it,
``input/result.schema.json``, an agent's host prompt ``input/agent-prompt.md``, the working
copy ``workspace/repository``), moves an earlier attempt's stdout and stderr to its record,
gives the writable folders to the job's user, and writes ``execution/runtime-budget.json``
and ``input/compute-decision.json``. The calls are the ones
:func:`runner.execution.attempt._stage` and ``_decide`` make, in their order; nothing else is
written to the ledger (no attempt starts), no image is looked at, no engine is contacted.

What differs from `runner run`'s staging: no GPU is handed out, so ``compute-decision.json``
names none; a plan with GPUs says ``accelerator: "gpu"`` with ``gpus: []`` (the scheduler
picks them). Assets are not staged: `runner run` mounts them from this host's asset cache
when it starts the container (they are not in the job folder). `runner run` on the same job
folder stages again (the same checks, the same bytes) before its attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from runner.caches import inputcache
from runner.contract import load_contract
from runner.core.errors import JobAlreadyFinished, JobBusy, ResourceExhausted
from runner.execution import agent_run, layout, records
from runner.execution.options import RunOptions
from runner.planning import plan, policy
from runner.results import envelope
from runner.staging import jobdir as staging
from runner.state.ledger import Budget, Ledger, read_state

__all__ = ["stage"]

NO_NEW_ATTEMPT = "; a job accepted before then is not staged again under an expired contract"


@dataclass(frozen=True)
class Staged:
    """What :func:`stage` laid out."""

    job_id: str
    job_dir: Path
    files: int
    """Files in ``input/`` (the contract's inputs and the runner's own files)."""
    bytes: int
    attempt: int
    """The attempt the folder is laid out for (1, or one more than the ledger records)."""
    user: str
    """``uid:gid`` the writable folders were given to (when staged as root)."""
    budget: Budget
    accepted_now: bool
    """The job was accepted in its ledger by this call (else it was accepted before)."""
    signed: bool
    """The contract was signed (else this host accepts unsigned contracts)."""


def stage(contract_path: Path, opts: RunOptions, *, host_uid: int, host_gid: int) -> Staged:
    """Check, plan and lay out the job folder of the contract at ``contract_path``; runs
    nothing. Raises what `runner run` refuses with, before and while staging, and
    :class:`~runner.core.errors.JobBusy` for a job with an attempt in flight."""
    contract = load_contract(contract_path, opts.trust)
    rules = opts.policy.policy
    job_id = plan.job_id_for(contract, opts.job_id, allow_override=rules.allowJobIdOverride)
    ledger_path = opts.state.job(job_id).ledger
    accepted = read_state(ledger_path).accepted if ledger_path.exists() else None
    resuming = accepted is not None and accepted.get("contractDigest") == contract.digest
    plan.check_mode(contract, rules)
    policy.check(contract, rules, datetime.now(UTC), check_times=not resuming)
    p = plan.build(
        contract,
        rules,
        job_id=job_id,
        host_uid=host_uid,
        host_gid=host_gid,
        labels=opts.labels,
        overrides=opts.overrides,
    )
    job = staging.prepare(opts.state.job(p.job_id).root)
    with job.locked():
        ledger = Ledger.open(job.ledger)
        st = ledger.state
        if st.accepted is not None and st.accepted.get("contractDigest") != contract.digest:
            raise JobAlreadyFinished(
                f"job id {p.job_id} belongs to another contract "
                f"({st.accepted.get('contractDigest')}) on this host",
                hint="give this contract its own --job-id",
            )
        if st.finished is not None:
            raise JobAlreadyFinished(
                f"job {p.job_id} already finished on this host ({st.finished.get('status')}); "
                "its folder is left as it is",
                hint="`runner status` shows it; stage it under another --job-id to run it again",
            )
        if st.in_flight is not None:
            raise JobBusy(
                f"job {p.job_id}: attempt {st.in_flight.number} is in flight (or its runner "
                "died); staging now would change its inputs under it",
                hint="`runner run` on the same contract reattaches to it or records its end",
            )
        policy.refuse_expired(contract, datetime.now(UTC), what=NO_NEW_ATTEMPT)
        accepted_now = st.accepted is None
        if accepted_now:
            data = {
                "jobId": p.job_id,
                "contractDigest": contract.digest,
                "limitSeconds": p.limits.timeout_seconds,
            }
            ledger.append("job.accepted", "job.accepted", data)
        limit = min(ledger.state.limit, p.limits.timeout_seconds)
        consumed = st.consumed
        if consumed >= limit:
            raise ResourceExhausted(
                f"job {p.job_id} has used {consumed:.1f} s of its {limit:.1f} s budget in "
                "earlier attempts; nothing is left to run it again",
                hint="the budget spans every attempt; a larger budget needs a new contract",
            )
        agent_run.refuse_spent(p, st)
        n = len(st.attempts) + 1
        via = inputcache.stager(inputcache.InputCache.of_state(opts.state.root), job)
        own = layout.own_inputs(p)
        files = staging.stage_inputs(job, contract, opts.input_rules(), via=via, extra=own)
        layout.working_copy(job, contract, p.limits.disk_quota_bytes)
        streams = [p.stdout_path, p.stderr_path]
        if n > 1:  # as runner.execution.attempt: the last attempt's streams move to its record
            if not (job.attempt_record(n - 1) / "output-manifest.json").exists():
                records.output_manifest(job, n - 1)
            records.rotate_streams(job, n - 1, streams)
        uid, gid = (int(x) for x in p.user.split(":"))
        staging.prepare_writable(job, uid, gid, streams)
        budget = Budget(limit, consumed)
        job.write_budget(budget)
        agent_limits = agent_run.limits(p.agent, st) if p.agent is not None else None
        decided = envelope.allocation(p, n, (), p.gpu_fallback, budget.as_json(), agent_limits)
        if isinstance(p.limits.gpus, int) and p.limits.gpus > 0:
            decided = decided.model_copy(update={"accelerator": "gpu"})  # GPUs: the scheduler's
        decision = (decided.model_dump_json(indent=2) + "\n").encode()
        files.append(layout.add_input(job, "compute-decision.json", decision))
    return Staged(
        job_id=p.job_id,
        job_dir=job.root,
        files=len(files),
        bytes=sum(f.size for f in files),
        attempt=n,
        user=p.user,
        budget=budget,
        accepted_now=accepted_now,
        signed=contract.signature is not None,
    )
