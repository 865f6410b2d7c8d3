"""``runner parse JOB``: re-read a finished job's stored evidence, running nothing.

By default each measurement is parsed again with the parser version its envelope records, so
the values must come out the same; ``latest`` uses the newest registered version of each
parser instead and records which versions changed. The stored evidence must still hash to what
the envelope recorded, or nothing is re-read. The result is a new envelope revision; the old
one is kept under ``record/``. An agent's job is re-read under the same redaction step as its
run (:func:`runner.execution.agent_run.withhold`): its adapter's secrets, read from the host policy
again and checked against the salted digests its attempts recorded in the ledger, out of every
string of the new envelope (what a reason quotes of the job's files redacted before it is cut),
and its files that hold one withheld from export. A job whose attempts were given secrets that
this policy does not name, cannot read, or holds other values of, is not re-graded
(:func:`redaction`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from runner.agents import adapters as agents
from runner.agents.adapters import AgentAdapter
from runner.contract import parse_json, verify_data
from runner.core.errors import Category, RefusedError
from runner.core.redaction import NONE, Redactor, quoting
from runner.core.safefs import UnsafePath
from runner.evidence import read as evidence
from runner.evidence import selfreport
from runner.execution import agent_run
from runner.models.envelope import Failure, Regrade, ResultEnvelope
from runner.parsers import registry
from runner.results import attest
from runner.staging import jobdir as staging
from runner.state.jobdir import JobDir, atomic_write

__all__ = ["EvidenceChanged", "redaction", "regrade"]


class EvidenceChanged(RefusedError):
    """The stored evidence no longer hashes to what the envelope recorded."""

    category = Category.PARSE_ERROR


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (-1, version)


def latest_version(parser_id: str) -> str:
    versions = [v for pid, v in registry.available() if pid == parser_id]
    return max(versions, key=_version_key)


def regrade(
    job_root: Path,
    *,
    latest: bool,
    max_bytes: int,
    result_key: Path | None,
    max_result_bytes: int = 1024 * 1024,
    agent_adapters: Mapping[str, AgentAdapter] | None = None,
) -> ResultEnvelope:
    """Re-read the job's evidence into a new envelope revision (under the job's lock);
    ``agent_adapters``: the host policy's, whose secrets an agent's job is redacted of."""
    job = JobDir(job_root)
    with job.locked():
        return _regrade(
            job,
            latest=latest,
            max_bytes=max_bytes,
            result_key=result_key,
            max_result_bytes=max_result_bytes,
            agent_adapters=agent_adapters or {},
        )


def redaction(job: JobDir, runtime: str | None, adapters: Mapping[str, AgentAdapter]) -> Redactor:
    """The redaction step of the finished job in ``job``, whose agent ran the runtime
    ``runtime`` (None: no agent): the host policy's ``adapters``' secrets for it, read now and
    checked against the salted digests its attempts recorded in the ledger
    (:func:`runner.execution.agent_run.adapter_redactor`). *Blind* (nothing it redacts may be
    trusted) where an attempt was given secrets that this policy does not name, that cannot be
    read, or that are not the values it was given (rotated since), and where the ledger cannot
    be read for an agent's job. A secret the policy names that cannot be read, where no attempt
    recorded any, raises :class:`HostConfigError`."""
    adapter = adapters.get(runtime) if runtime else None
    state = agent_run.ledger_state(job)
    if state is None and runtime is not None:
        return NONE.blinded(
            f"{job.ledger} cannot be read, so what the agent's attempts were given cannot be "
            "checked"
        )
    secrets = agents.secret_values(adapter) if adapter is not None and adapter.secrets else None
    return agent_run.adapter_redactor(adapter, secrets, state)


def _regrade(
    job: JobDir,
    *,
    latest: bool,
    max_bytes: int,
    result_key: Path | None,
    max_result_bytes: int,
    agent_adapters: Mapping[str, AgentAdapter],
) -> ResultEnvelope:
    job_root = job.root
    if not job.envelope.exists():
        raise RefusedError(
            f"{job_root} has no result.json to re-grade",
            hint="run the job first; `runner status JOB` shows where it stands",
        )
    old = ResultEnvelope.model_validate_json(job.envelope.read_bytes())
    raw = (job.input / "task.json").read_bytes()
    contract = verify_data(parse_json(raw, "input/task.json"), raw, job.input, "input/task.json")
    if contract.digest != old.contractDigest:
        raise RefusedError(
            f"input/task.json hashes to {contract.digest}, the envelope says {old.contractDigest}",
            hint="the staged contract was changed; re-grading needs the contract that ran",
        )
    for m in old.measurements:
        try:
            digest, _ = staging.sha256_under(job.output, m.evidence.path, max_bytes)
        except (UnsafePath, OSError) as exc:
            why = exc.problem if isinstance(exc, UnsafePath) else exc.strerror
            raise EvidenceChanged(
                f"{m.evidence.path} cannot be read any more: it {why}",
                hint="the evidence was changed after the run; nothing was re-read",
            ) from exc
        if digest is None:
            raise EvidenceChanged(
                f"{m.evidence.path} is now over the {max_bytes:,} byte cap for evidence",
                hint="the evidence was changed after the run; nothing was re-read",
            )
        if f"sha256:{digest}" != m.evidence.sha256:
            raise EvidenceChanged(
                f"{m.evidence.path} now hashes to sha256:{digest}; the envelope recorded "
                f"{m.evidence.sha256}",
                hint="the evidence was changed after the run; nothing was re-read",
            )
    recorded = {m.measurementId: m.parser.version for m in old.measurements}
    versions: dict[str, str] = {}
    changes: list[str] = []
    for binding in contract.model.measurements:
        mid, pid = binding.measurementId, binding.parser.id
        was = recorded.get(mid, binding.parser.version)
        now = latest_version(pid) if latest else was
        versions[mid] = now
        if now != was:
            changes.append(f"{mid}: {pid} version {was} -> {now}")
    agent = contract.model.agent
    redact = redaction(job, agent.runtime if agent is not None else None, agent_adapters)
    if redact.blind is not None:  # nothing re-read could be trusted to be redacted
        raise RefusedError(
            f"{job_root} cannot be re-graded with this host policy: {redact.blind}",
            hint="re-grade with --policy naming the host policy the job ran under, its agent "
            "secrets readable and the values the job's attempts were given",
        )
    with quoting(redact):  # what a reason quotes of the job's files: redacted whole
        results, errors = evidence.read_measurements(job.output, contract, max_bytes, versions)
    # The same bytes (checked above), so the same attempt wrote them.
    wrote = {m.evidence.path: m.evidence.attempt for m in old.measurements}
    results = [
        r.model_copy(
            update={
                "evidence": r.evidence.model_copy(update={"attempt": wrote.get(r.evidence.path)})
            }
        )
        for r in results
    ]
    failure, status = old.failure, old.status
    if old.failure is None or old.failure.stage == "parsers":
        failure, status = None, "succeeded"
        if errors:
            failure = Failure(
                category=errors[0].category,
                stage="parsers",
                retryable=False,
                reason=errors[0].reason,
            )
            status = "partial" if results else "failed"
    with quoting(redact):
        claim = selfreport.read(
            job.output, max_bytes, max_result_bytes, contract=contract.data, verdict=status
        )
    new = old.model_copy(
        update={
            "measurements": results,
            "measurementErrors": errors,
            "failure": failure,
            "status": status,
            "agentResult": claim,
            "revision": old.revision + 1,
            "regrade": Regrade(
                at=datetime.now(UTC).isoformat(timespec="seconds"),
                parserVersions="latest" if latest else "recorded",
                changes=changes,
            ),
        }
    )
    new = ResultEnvelope.model_validate(new.model_dump())
    if not redact and (job.record / agent_run.WITHHELD).exists():
        raise RefusedError(
            f"{job.record / agent_run.WITHHELD} lists files that hold an agent's secret, and "
            "this host policy names no secret for the contract's agent runtime to redact the "
            "values re-read from them with",
            hint="re-grade with --policy naming the host policy the job ran under",
        )
    if redact:  # the run's warnings of withheld files are said again, as they are now
        kept = [w for w in new.warnings if " is withheld from export: " not in w]
        new = agent_run.withhold(redact, job, new.model_copy(update={"warnings": kept}))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    job.envelope.replace(job.record / f"result-{stamp}.json")
    atomic_write(job.envelope, (new.model_dump_json(indent=2) + "\n").encode())
    if result_key is not None:
        attest.sign_result(new, job.root, result_key)
    return new
