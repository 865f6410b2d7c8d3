"""An agent_planned run's attempts: the agent's limits left, its guard, its usage in the ledger.

The agent's turns and cost are budgets like the wall time: cumulative over every attempt
(retries and reruns never reset them), recorded in the ledger as one ``agent.usage`` event per
attempt, passed to each attempt's runtime as what is left (its argv's ``{maxTurns}`` and
``{maxBudgetUsd}``), enforced by the runner while the agent runs
(:class:`~runner.agents.transcript.AgentGuard` in the watch loop: the runner's own capture of the
agent's stdout, ``record/attempts/<n>/transcript.jsonl``, floored by the egress proxy's count
of model requests), and refused before an attempt starts once spent.

Long on purpose: an attempt's agent from its start to what the runner signs of it, the one
redaction step of its secrets included (read, checked against the digests each attempt
recorded, applied to its streams, records and envelope, and failing closed where it cannot
be), kept together so no path of an attempt's end skips a part of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.agents import adapters as agents
from runner.agents.adapters import AgentAdapter, AgentPlan
from runner.backends.types import HostPort
from runner.core import safefs
from runner.core.errors import Category, HostConfigError, ResourceExhausted
from runner.core.redaction import NONE, Redactor
from runner.execution.container import Outcome
from runner.models.envelope import (
    AgentLimits,
    AgentPromptRecord,
    AgentRecord,
    AgentRuntimeRecord,
    AgentUsageAttempt,
    AgentUsageRecord,
    Failure,
    ResultEnvelope,
)
from runner.planning.plan import ExecutionPlan
from runner.results.bundle import output_files
from runner.state.jobdir import JobDir, write_json
from runner.state.ledger import Ledger, LedgerState, read_state

if TYPE_CHECKING:  # imported where an agent's attempt needs them: a job without one never does
    from runner.agents import transcript
    from runner.egress import slots as egress

__all__ = [
    "WITHHELD",
    "adapter_redactor",
    "agent_record",
    "checked",
    "ended",
    "guard",
    "ledger_state",
    "left",
    "limits",
    "lost",
    "no_model_use",
    "recorded",
    "records",
    "redact_records",
    "redacted",
    "redactor",
    "refuse_spent",
    "settle",
    "usage_record",
    "withhold",
]

LIMITS = {"agent.maxTurns": "turns", "agent.maxBudgetUsd": "USD"}
"""The agent's limits a guard stops it at; with the transcript's TAMPERED, every reason the
ledger's agent.usage records for a stop."""


def prices(agent: AgentPlan) -> transcript.Prices | None:
    from runner.agents import transcript

    p = agent.adapter.prices
    if p is None:
        return None
    return transcript.Prices(
        p.inputPerMTok, p.outputPerMTok, p.cacheReadPerMTok, p.cacheWritePerMTok
    )


def left(agent: AgentPlan, state: LedgerState) -> tuple[int | None, float | None]:
    """What is left of the agent's limits after the attempts the ledger has recorded."""
    return agent.left(state.agent_turns, state.agent_cost)


def refuse_spent(p: ExecutionPlan, state: LedgerState) -> None:
    """Refuse a new attempt when earlier attempts spent the agent's turns or its budget."""
    agent = p.agent
    if agent is None:
        return
    turns_left, budget_left = left(agent, state)
    if turns_left is not None and turns_left <= 0:
        raise ResourceExhausted(
            f"agent.maxTurns: job {p.job_id}'s agent has taken {state.agent_turns} turns of "
            f"its {agent.max_turns} in earlier attempts; nothing is left to run it again",
            hint="the agent's turns span every attempt; more turns need a new contract",
        )
    if budget_left is not None and budget_left <= 0:
        raise ResourceExhausted(
            f"agent.maxBudgetUsd: job {p.job_id}'s agent has spent ${state.agent_cost:g} of its "
            f"${agent.max_budget_usd:g} in earlier attempts; nothing is left to run it again",
            hint="the agent's budget spans every attempt; a larger budget needs a new contract",
        )


def limits(agent: AgentPlan, state: LedgerState) -> AgentLimits:
    """The agent's limits as an attempt starting now gets them (its compute decision)."""
    turns_left, budget_left = left(agent, state)
    return AgentLimits(
        runtime=agent.runtime,
        maxTurns=turns_left,
        maxBudgetUsd=None if budget_left is None else round(budget_left, 6),
        turnsUsed=state.agent_turns,
        costUsdUsed=state.agent_cost,
    )


def guard(
    p: ExecutionPlan,
    job: JobDir,
    state: LedgerState,
    n: int,
    eg: egress.Egress | None = None,
) -> transcript.AgentGuard | None:
    """The guard of attempt ``n`` in flight: the runner's capture of its stdout (in its
    record), the proxy's count of its model requests (``eg``: its egress lease), and what is
    left of the agent's limits."""
    if p.agent is None or p.agent.adapter.usage == "none":
        return None
    from runner.agents import transcript

    capture = transcript.Capture(
        job.attempt_record(n) / transcript.CAPTURE, prices(p.agent), p.limits.log_limit_bytes
    )
    proxy = None
    if eg is not None and p.agent.adapter.allow:
        hosts = {str(HostPort.parse(a)) for a in p.agent.adapter.allow}
        proxy = transcript.ProxyCount(eg.lease, hosts, eg.proxy, eg.since - 1.0)
    return transcript.AgentGuard(capture, *left(p.agent, state), proxy=proxy)


def keep_transcript(p: ExecutionPlan, job: JobDir, n: int) -> None:
    """Copy attempt ``n``'s captured stdout to ``output/<stdoutPath>`` once its container has
    ended, for the job's evidence and the envelope's logs (whatever the job left at that name
    is replaced; no link is followed). The copy is never read for a budget decision."""
    if p.agent is None or p.agent.adapter.usage == "none":
        return  # its stdout went to output/ itself
    from runner.agents import transcript

    with (
        contextlib.suppress(safefs.UnsafePath, OSError),
        safefs.open_under(job.attempt_record(n), transcript.CAPTURE) as src,
    ):
        safefs.makedirs_under(job.output, os.path.dirname(p.stdout_path) or ".")
        with safefs.parent_fd(job.output, p.stdout_path) as (fd, name):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(name, dir_fd=fd)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            out = os.open(name, flags, 0o644, dir_fd=fd)
            with os.fdopen(out, "wb") as dst:
                while chunk := src.read(1024 * 1024):
                    dst.write(chunk)


def ended(outcome: Outcome, agent_guard: transcript.AgentGuard | None) -> Outcome:
    """The attempt's end with the agent's limits applied: an agent whose transcript shows it
    past a limit (the runtime stopped itself there, or the runner's guard did not get to it
    before it ended) ended at that limit; a stop for the wall budget or Ctrl-C stands."""
    if agent_guard is None or outcome.stopped_for or outcome.timed_out or outcome.cancelled:
        return outcome
    over = agent_guard.final().over(agent_guard.turns_left, agent_guard.budget_left)
    return outcome if over is None else dataclasses.replace(outcome, stopped_for=over)


def redactor(
    p: ExecutionPlan,
    secrets: dict[str, str] | None = None,
    state: LedgerState | None = None,
    attempt: int | None = None,
) -> Redactor:
    """The one redaction step of an agent's attempts: its adapter's secrets (``secrets`` as
    the attempt was given them, else read again: an attempt picked up after a restart), in
    every form :mod:`runner.core.redaction` finds. Nothing to redact without secrets. With
    ``state``, checked against the salted digests each attempt (``attempt``: that one only)
    recorded at its start: secrets that cannot be read now, or are not the values an attempt
    was given (rotated meanwhile), make the step *blind* (fail closed: :func:`scrub`,
    :func:`withhold`)."""
    agent = p.agent.adapter if p.agent is not None else None
    return adapter_redactor(agent, secrets, state, attempt)


def adapter_redactor(
    adapter: AgentAdapter | None,
    secrets: dict[str, str] | None = None,
    state: LedgerState | None = None,
    attempt: int | None = None,
) -> Redactor:
    """:func:`redactor` of the agent runtime ``adapter`` (the host policy's; None: the policy
    names none): what a re-grade and a report of a finished job redact it with. An adapter
    that names no secret where an attempt recorded that it was given some is blind too."""
    started = [
        (a.number, a.starting["secretDigests"])
        for a in (state.attempts if state is not None else [])
        if (attempt is None or a.number == attempt) and "secretDigests" in a.starting
    ]
    if adapter is None or not adapter.secrets:
        if not started:
            return NONE
        n, recorded = started[0]
        sums = recorded.get("sha256") if isinstance(recorded, dict) else None
        names = ", ".join(sorted(map(str, sums))) if isinstance(sums, dict) else "(unreadable)"
        return NONE.blinded(
            f"attempt {n} was given the agent secret {names}, and this host policy names no "
            "secret for the agent's runtime, so what it wrote cannot be redacted"
        )
    if secrets is None:
        try:
            secrets = agents.secret_values(adapter)
        except HostConfigError as exc:
            if not started:
                return NONE
            n = started[0][0]
            return NONE.blinded(
                f"the agent's secrets could not be read again when the runner picked up "
                f"attempt {n} ({exc.message}), so what it wrote cannot be redacted"
            )
    redact = Redactor(secrets)
    for n, recorded in started:
        changed = redact.differs(recorded if isinstance(recorded, dict) else {})
        if changed:
            return redact.blinded(
                f"the agent secret {', '.join(changed)} is not the value attempt {n} was "
                "given (changed or rotated since it started), so what it wrote cannot be "
                "redacted"
            )
    return redact


def checked(given: Redactor, p: ExecutionPlan, state: LedgerState) -> Redactor:
    """The step for everything a run writes and signs at its end: the last attempt's
    (``given``, when it started in this process), else its secrets read again; either
    checked against what every attempt was given (:func:`redactor`)."""
    if not given:
        return redactor(p, None, state)
    return redactor(p, {n: v.decode() for n, v in given.values().items()}, state)


UNREDACTED = "withheld by the runner: {why}. The container's stream this file held is not kept.\n"
"""What replaces a stream or log of an attempt that a blind step cannot redact."""


def scrub(
    p: ExecutionPlan,
    job: JobDir,
    n: int,
    secrets: dict[str, str] | None = None,
    state: LedgerState | None = None,
) -> None:
    """An agent's secrets out of what the runner keeps of attempt ``n`` as it ends, before
    anything hashes it: its transcript and stderr, and the engine's log (the agent could have
    printed its own environment). ``secrets`` None: read them again, and checked against
    what attempt ``n`` was given (``state``); where they cannot be, each of those files is
    replaced by a note saying why (fail closed: what cannot be redacted is not kept)."""
    redact = redactor(p, secrets, state, n)
    if not redact:  # no agent, or one with no secrets: nothing to redact
        return
    from runner.agents import transcript

    if redact.blind is not None:
        note = UNREDACTED.format(why=redact.blind).encode()
        _replace(job.output, [p.stdout_path, p.stderr_path], note)
        _replace(job.attempt_record(n), ["engine.log", transcript.CAPTURE], note)
        return
    redact.files(job.output, [p.stdout_path, p.stderr_path])
    redact.files(job.attempt_record(n), ["engine.log", transcript.CAPTURE])


def _replace(root: Path, rels: list[str], data: bytes) -> None:
    """Each file ``root/rel`` that exists replaced by ``data`` (no link followed)."""
    for rel in rels:
        with (
            contextlib.suppress(safefs.UnsafePath, OSError),
            safefs.parent_fd(root, rel) as (fd, name),
        ):
            try:
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(name, flags, 0o644, dir_fd=fd), "wb") as out:
                out.write(data)


def settle(
    p: ExecutionPlan,
    job: JobDir,
    n: int,
    secrets: dict[str, str] | None = None,
    state: LedgerState | None = None,
) -> None:
    """Attempt ``n``'s container has ended: its captured stdout copied to output/
    (:func:`keep_transcript`), then the agent's secrets out of what is kept (:func:`scrub`)."""
    keep_transcript(p, job, n)
    scrub(p, job, n, secrets, state)


WITHHELD = "withheld.json"
"""``record/withheld.json``: the output files that hold a secret, which no export carries."""


def redact_records(redact: Redactor, job: JobDir) -> list[str]:
    """Every file the runner keeps in ``record/attempts/`` redacted in place (before the
    envelope hashes them): each attempt's engine and proxy logs, its output manifest (the
    job's file names), the streams moved there. The files changed, relative to that folder
    (a file redacted before reads clean: a fast scan)."""
    if not redact:
        return []
    folder = job.record / "attempts"
    rels = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        rels += [os.path.relpath(os.path.join(dirpath, f), folder) for f in sorted(filenames)]
    return redact.files(folder, rels)


def withhold(redact: Redactor, job: JobDir, envelope: ResultEnvelope) -> ResultEnvelope:
    """The envelope as the runner writes, signs and prints it: every string in it redacted
    (a request target, a host, a reason, a file name). Each output file it names (evidence,
    the job's result.json and the files it lists) that holds a secret stays as the job wrote
    it, hashed as it is (redacting it would change the evidence), and is withheld from every
    export: listed with why in ``record/withheld.json`` and named in the envelope's warnings."""
    if redact and redact.blind is None and (before := _unredactable(job)) is not None:
        redact = redact.blinded(before)  # a run that could not redact stays so (a re-grade)
    if not redact:
        return envelope
    held: list[dict[str, Any]] = []
    seen: set[str] = set()
    for path, digest, _problem in output_files(envelope):
        if path in seen or digest is None:  # unhashed: never exported
            continue
        seen.add(path)
        why = None
        if redact.blind is not None:  # nothing can be checked: nothing leaves
            try:
                rel = "/".join(safefs.parts(path))
            except safefs.UnsafePath:
                rel = path
            why = f"it cannot be checked for the agent's secrets: {redact.blind}"
            held.append({"path": redact.text(f"output/{rel}"), "secrets": [], "why": why})
            continue
        try:
            rel = "/".join(safefs.parts(path))
            named = redact.found(rel.encode())
            names = named or redact.scan(job.output, rel)
        except safefs.UnsafePath as exc:
            rel, names, why = path, [], None if exc.missing else exc.problem
        except OSError as exc:
            rel, names, why = path, [], exc.strerror or str(exc)
        if names:
            what = "its name holds" if named else "it holds"
            why = (
                f"{what} the value of the agent secret {', '.join(names)}; redacting it "
                "would change the evidence the envelope hashes, so it is kept on this host "
                "only and never exported"
            )
        elif why is not None:  # fail closed: what cannot be checked never leaves
            why = f"it could not be read to check it for the agent's secrets ({why})"
        if why is not None:
            held.append({"path": redact.text(f"output/{rel}"), "secrets": names, "why": why})
    target = job.record / WITHHELD
    blind = {"unredactable": redact.blind} if redact.blind is not None else {}
    if held or blind:
        write_json(target, {"schemaVersion": "1.0", "files": held, **blind})
    else:
        target.unlink(missing_ok=True)
    warnings = [f"{h['path']} is withheld from export: {h['why']}" for h in held]
    if redact.blind is not None:
        warnings.insert(0, f"this run cannot be exported: {redact.blind}")
    envelope = envelope.model_copy(update={"warnings": [*envelope.warnings, *warnings]})
    return redacted(redact, envelope)


def _unredactable(job: JobDir) -> str | None:
    """Why an earlier end of this run could not redact it (``record/withheld.json``'s
    ``unredactable``), or None; a list that cannot be read counts as such an end."""
    try:
        with safefs.open_under(job.record, WITHHELD) as f:
            listed = json.loads(f.read(16 * 1024 * 1024))
    except safefs.UnsafePath as exc:
        return None if exc.missing else f"record/{WITHHELD}: {exc.problem}"
    except (OSError, ValueError) as exc:
        return f"record/{WITHHELD} cannot be read ({exc})"
    why = listed.get("unredactable") if isinstance(listed, dict) else "not the list the run wrote"
    return None if why is None else str(why)


def ledger_state(job: JobDir | None) -> LedgerState | None:
    """The job's ledger as it stands (read only), or None where there is none to read."""
    if job is None:
        return None
    try:
        return read_state(job.ledger)
    except (OSError, ValueError):
        return None


def redacted(redact: Redactor, envelope: ResultEnvelope) -> ResultEnvelope:
    """The envelope with every string in it (keys too) redacted."""
    if not redact:
        return envelope
    return ResultEnvelope.model_validate(redact.value(envelope.model_dump(mode="json")))


def lost(
    ledger: Ledger,
    p: ExecutionPlan,
    job: JobDir,
    n: int,
    agent_guard: transcript.AgentGuard | None,
) -> None:
    """Attempt ``n`` of an agent ended unseen (its container vanished or never started): its
    usage is what its transcript shows, recorded before a new attempt counts what is left."""
    if p.agent is not None:
        record(ledger, n, usage_of(p, job, n, agent_guard))
        settle(p, job, n, state=ledger.state)


def usage_of(
    p: ExecutionPlan, job: JobDir, n: int, agent_guard: transcript.AgentGuard | None
) -> transcript.Usage:
    """Attempt ``n``'s usage: from its guard, or read from the runner's capture of its stdout
    (never from the copy in output/, which the job could have written)."""
    if agent_guard is not None:
        return agent_guard.final()
    from runner.agents import transcript

    if p.agent is None or p.agent.adapter.usage == "none":
        return transcript.Usage()
    meter = transcript.Meter(job.attempt_record(n), transcript.CAPTURE, prices(p.agent))
    return meter.drain(requests=proxy_requests(p, job, n))


def no_model_use(
    p: ExecutionPlan,
    job: JobDir,
    n: int,
    agent_guard: transcript.AgentGuard | None,
    failure: Failure | None,
) -> Failure | None:
    """An agent that "succeeded" in the contract's image without one model answer in the
    runner's capture of its stream and (behind the proxy) without one request to its model's
    hosts did not do the work as an agent: whatever the image ran in the runtime's place
    wrote the result. Such an attempt ends missing_evidence (its other failures stand)."""
    agent = p.agent
    if failure is not None or agent is None or not agent.in_contract_image:
        return failure
    if agent.adapter.usage == "none":
        return failure  # the host counts nothing of this runtime: nothing to go by
    usage = usage_of(p, job, n, agent_guard)
    requests = proxy_requests(p, job, n)
    if usage.turns > 0 or usage.answers > 0 or (requests or 0) > 0:
        return failure
    counted = " and the egress proxy counted no request to its model" if requests == 0 else ""
    return Failure(
        category=Category.MISSING_EVIDENCE,
        stage="container",
        retryable=Category.MISSING_EVIDENCE.retryable,
        reason=f"the agent exited 0 in the contract's image {p.image.reference} without one "
        f"model answer in its transcript (the runner's capture of its stdout){counted}: "
        "something other than the agent runtime did the work",
    )


def record(ledger: Ledger, n: int, usage: transcript.Usage, stopped_for: str | None = None) -> None:
    """Append attempt ``n``'s agent.usage (once: a second call for it changes nothing)."""
    from runner.agents import transcript

    state = ledger.state
    if n in state.agent_usage:
        return
    data: dict[str, Any] = {
        "attempt": n,
        "turns": usage.turns,
        "costUsd": usage.costUsd,
        "reportedTurns": usage.reportedTurns,
        "reportedCostUsd": usage.reportedCostUsd,
        "answers": usage.answers,
        "requests": usage.requests,
        "tokens": usage.tokens,
        "stoppedFor": stopped_for if stopped_for in {*LIMITS, transcript.TAMPERED} else None,
        "totalTurns": state.agent_turns + usage.turns,
        "totalCostUsd": round(state.agent_cost + usage.costUsd, 6),
    }
    ledger.append(f"attempt-{n}.agent-usage", "agent.usage", data)


def recorded(
    ledger: Ledger,
    p: ExecutionPlan,
    job: JobDir,
    agent_guard: transcript.AgentGuard | None,
    outcome: Outcome,
    failure: Failure | None,
) -> Failure | None:
    """Record the ended attempt's usage in the ledger; the failure of an attempt stopped at an
    agent limit says how much was used, over every attempt, of what."""
    n = len(ledger.state.attempts)
    record(ledger, n, usage_of(p, job, n, agent_guard), outcome.stopped_for)
    if failure is None or failure.category != Category.RESOURCE_EXHAUSTED:
        return failure
    why = agent_guard.why if agent_guard is not None else None
    reason = limit_reason(p, ledger.state, outcome.stopped_for or "", why)
    return failure.model_copy(update={"reason": reason})


MAX_EGRESS_LOG = 16 * 1024 * 1024


def proxy_requests(p: ExecutionPlan, job: JobDir | None, n: int) -> int | None:
    """The requests attempt ``n``'s agent made of its model's hosts, as the egress proxy
    logged them (``record/attempts/<n>/egress.log``, runner-written): the count the agent
    cannot touch. None when the attempt had no proxy."""
    if p.agent is None or job is None or not p.agent.adapter.allow:
        return None
    from runner.egress import proxylog

    try:
        with safefs.open_under(job.attempt_record(n), "egress.log") as f:
            text = f.read(MAX_EGRESS_LOG).decode("utf-8", "replace")
    except (safefs.UnsafePath, OSError):
        return None
    hosts = {str(HostPort.parse(a)) for a in p.agent.adapter.allow}
    return sum(
        1
        for c in proxylog.read_log(text)
        if c.decision == "allowed" and f"{c.host}:{c.port}" in hosts
    )


def usage_record(
    p: ExecutionPlan, state: LedgerState, job: JobDir | None = None
) -> AgentUsageRecord | None:
    """The envelope's agentUsage: every attempt's and the total, against the limits; the
    model requests the proxy counted, where it kept a log."""
    agent = p.agent
    if agent is None:
        return None
    attempts = [
        AgentUsageAttempt(
            attempt=n,
            turns=int(d.get("turns", 0)),
            costUsd=float(d.get("costUsd", 0.0)),
            reportedTurns=d.get("reportedTurns"),
            reportedCostUsd=d.get("reportedCostUsd"),
            requests=d.get("requests")
            if d.get("requests") is not None
            else proxy_requests(p, job, n),
            stoppedFor=d.get("stoppedFor"),
        )
        for n, d in sorted(state.agent_usage.items())
    ]
    counted = [a.requests for a in attempts if a.requests is not None]
    return AgentUsageRecord(
        source=agent.adapter.usage,
        maxTurns=agent.max_turns,
        maxBudgetUsd=agent.max_budget_usd,
        turns=state.agent_turns,
        costUsd=state.agent_cost,
        requests=sum(counted) if counted else None,
        attempts=attempts,
    )


def agent_record(p: ExecutionPlan, state: LedgerState, n: int | None) -> AgentRecord | None:
    """The envelope's agent: what ran, with attempt ``n``'s argv."""
    agent = p.agent
    if agent is None:
        return None
    starting = state.attempts[n - 1].starting if n and n <= len(state.attempts) else {}
    brought, prompt = starting.get("agentRuntime"), starting.get("agentPrompt")
    return AgentRecord(
        runtime=agent.runtime,
        image=agent.adapter.image,
        contractImage=agent.contract_image,
        runIn=agent.adapter.runIn,
        commandsImageId=(starting.get("image") or {}).get("id"),
        agentRuntime=AgentRuntimeRecord.model_validate(brought) if brought else None,
        argv=[str(a) for a in starting.get("agentArgv", [])],
        prompt=agent.prompt,
        promptSource=agent.prompt_source,
        hostPrompt=AgentPromptRecord.model_validate(prompt) if prompt else None,
        transcript=p.stdout_path,
        allow=[str(x) for x in p.egress.allow] if p.egress else list(agent.adapter.allow),
        network=p.limits.network,
    )


def records(
    p: ExecutionPlan, state: LedgerState, n: int | None, job: JobDir | None = None
) -> tuple[AgentRecord | None, AgentUsageRecord | None]:
    """The envelope's agent (with attempt ``n``'s argv) and agentUsage."""
    return agent_record(p, state, n), usage_record(p, state, job)


def limit_reason(p: ExecutionPlan, state: LedgerState, which: str, why: str | None = None) -> str:
    """Why an attempt stopped at an agent limit, with the usage so far. Turns are model
    answers (distinct answers in the agent's stream), floored by the model requests the egress
    proxy counted."""
    from runner.agents import transcript

    agent = p.agent
    if agent is None:
        return which
    if which == transcript.TAMPERED:
        return (
            f"the runner could no longer read the agent's usage ({why or 'its stream'}) and "
            f"stopped it (fail closed): {state.agent_turns} turns (model answers) counted over "
            "every attempt (usage in agentUsage)"
        )
    if which == "agent.maxTurns":
        return (
            f"the agent passed agent.maxTurns: {state.agent_turns} turns (model answers, or "
            "model requests the egress proxy counted where more) over every attempt, the "
            f"contract allows {agent.max_turns}; it was stopped (usage in agentUsage)"
        )
    return (
        f"the agent passed agent.maxBudgetUsd: ${state.agent_cost:g} over every attempt, the "
        f"contract allows ${agent.max_budget_usd:g}; it was stopped (usage in agentUsage)"
    )
