"""The job's budget ledger: an append-only, hash-chained JSONL file that outlives the runner.

``record/ledger.jsonl`` holds one event a line. Each event names the previous one by the
SHA-256 of its line (a chain), carries a stable ``eventId`` (appending the same event again is
a no-op; the same id with other content is an error) and is fsynced before the action it
records is taken: "attempt 2 starting as container X" is on disk before X is created.

Events::

    job.accepted        contract digest, budget limit           (first event)
    job.rerun           a finished job is run again (--rerun), under the same budget
    attempt.starting    attempt n, container name               (intent, before create)
    attempt.started     attempt n, container id                 (after start)
    heartbeat           attempt n, seconds this attempt, seconds consumed in all
    attempt.finished    attempt n, exit code, OOM, classification, seconds, how it was learnt
    budget.exhausted    consumed >= limit
    agent.usage         an agent's turns and cost in attempt n, and over every attempt so far
                        (once per attempt, after its end; agent_planned contracts only)
    job.finished        status, sha256 of the envelope          (the job has its result)

A torn last line (the runner died mid-write) is kept byte for byte in a side file and cut off
before anything new is appended. A broken line anywhere else is an error, never skipped.

Fencing: an open :class:`Ledger` knows the file's size after its own last write, and every
append first checks (on the file it is about to write) that nobody else has written since.
When someone has (a runner on another host that took the job over after this one stopped
proving it was alive, see ``runner.execution.takeover``), the append raises
:class:`~runner.core.errors.JobFenced` and writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runner.core import clock, interrupts, jsondepth
from runner.core.errors import (
    InfrastructureError,
    JobAlreadyFinished,
    JobBusy,
    JobFenced,
    ResourceExhausted,
)

__all__ = [
    "Attempt",
    "Budget",
    "Ledger",
    "LedgerCorrupt",
    "LedgerEvent",
    "LedgerState",
    "parse_time",
    "read_state",
    "state_of",
    "verify_file",
]

EventType = Literal[
    "job.accepted",
    "job.rerun",
    "attempt.starting",
    "attempt.started",
    "heartbeat",
    "attempt.finished",
    "budget.exhausted",
    "agent.usage",
    "job.finished",
]


class LedgerEvent(BaseModel):
    """One line of the ledger (``contracts/ledger-event.schema.json``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schemaVersion: Literal["1.0"] = "1.0"
    seq: int = Field(ge=0, description="Position in the ledger, from 0.")
    eventId: str = Field(min_length=1, description="Stable id: the same event is appended once.")
    type: EventType
    at: str = Field(description="When it was written (UTC, ISO 8601).")
    prev: str | None = Field(description="sha256 of the previous line's bytes; null first.")
    data: dict[str, Any] = Field(default_factory=dict)


class LedgerCorrupt(InfrastructureError):
    """The ledger has a broken line, chain or order; the job is not touched until fixed."""

    retryable = False


def _now() -> str:
    return clock.now().isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_time(text: str | None) -> datetime | None:
    """An ISO 8601 / RFC 3339 time (engine times have nanoseconds); None when absent, zero, not
    a string, or without a time zone (an engine's answer is compared with this host's
    clock, which a time of no zone cannot be)."""
    if not isinstance(text, str) or not text or text.startswith("0001-01-01"):
        return None
    text = text.replace("Z", "+00:00")
    head, dot, rest = text.partition(".")
    if dot:
        digits = rest[: len(rest) - len(rest.lstrip("0123456789"))]
        zone = rest[len(digits) :]
        text = f"{head}.{digits[:6]}{zone}"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def _line_hash(line: bytes) -> str:
    return "sha256:" + hashlib.sha256(line).hexdigest()


@dataclass
class Attempt:
    """One attempt as the ledger tells it."""

    number: int
    container_name: str
    starting_at: datetime
    starting: dict[str, Any] = field(default_factory=dict)
    """The attempt.starting event's data (container name, image)."""
    container_id: str | None = None
    started_at: datetime | None = None
    seconds: float = 0.0
    """This attempt's running time: final when finished, else as of the last heartbeat."""
    last_beat_at: datetime | None = None
    finished: dict[str, Any] | None = None


@dataclass(frozen=True)
class Budget:
    """A job's runtime budget: its limit and what every attempt together has consumed."""

    limit: float
    consumed: float

    @property
    def remaining(self) -> float:
        return round(max(self.limit - self.consumed, 0.0), 3)

    def as_json(self) -> dict[str, float]:
        """As runtime-budget.json, the envelope and ``runner status`` show it."""
        return {
            "limitSeconds": round(self.limit, 3),
            "consumedSeconds": round(self.consumed, 3),
            "remainingSeconds": self.remaining,
        }


@dataclass
class LedgerState:
    """What the ledger says about the job, derived from its events."""

    accepted: dict[str, Any] | None = None
    attempts: list[Attempt] = field(default_factory=list)
    finished: dict[str, Any] | None = None
    reruns: int = 0
    agent_usage: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Each attempt's agent.usage event data, by attempt."""

    @property
    def agent_turns(self) -> int:
        """An agent's turns over every attempt recorded so far."""
        return sum(int(u.get("turns", 0)) for u in self.agent_usage.values())

    @property
    def agent_cost(self) -> float:
        """An agent's cost (USD) over every attempt recorded so far."""
        return round(sum(float(u.get("costUsd", 0.0)) for u in self.agent_usage.values()), 6)

    def attempt(self, n: int) -> Attempt | None:
        """Attempt ``n`` as the ledger has it, or None."""
        return next((a for a in self.attempts if a.number == n), None)

    @property
    def in_flight(self) -> Attempt | None:
        last = self.attempts[-1] if self.attempts else None
        return last if last is not None and last.finished is None else None

    @property
    def consumed(self) -> float:
        return sum(a.seconds for a in self.attempts)

    @property
    def limit(self) -> float:
        return float((self.accepted or {}).get("limitSeconds", 0.0))

    def budget(self, limit: float | None = None) -> Budget:
        """The budget so far, against ``limit`` (default: the one accepted)."""
        return Budget(self.limit if limit is None else limit, self.consumed)

    def left_to_schedule(self, job_id: str, contract_digest: str, limit: float, by: str) -> float:
        """Seconds a scheduler (``by``: Slurm, the cluster) may give the job: what is left of
        ``limit`` once this ledger's attempts are counted, when this contract's job was
        accepted here (``limit`` itself when nothing was). Refuses a job id of another
        contract or a finished job (``JobAlreadyFinished``), one with an attempt in flight
        (``JobBusy``: the scheduler would run it a second time), and one with less than a
        second left (``ResourceExhausted``)."""
        if self.accepted is not None:
            theirs = self.accepted.get("contractDigest")
            if theirs != contract_digest:
                raise JobAlreadyFinished(
                    f"job id {job_id} belongs to another contract ({theirs}) in this state folder",
                    hint="give this contract its own --job-id",
                )
            if self.finished is not None:
                raise JobAlreadyFinished(
                    f"job {job_id} already finished ({self.finished.get('status')})",
                    hint="`runner status` shows it; `runner run --rerun` runs it again on purpose",
                )
            if self.in_flight is not None:
                raise JobBusy(
                    f"job {job_id}: attempt {self.in_flight.number} is in flight (or its runner "
                    f"died); {by} would run it a second time",
                    hint="`runner status` shows it; `runner run` on its host resumes it, or "
                    "schedule it once it has ended",
                )
            limit = self.budget(min(self.limit, limit)).remaining
        if not math.isfinite(limit) or limit < 1:
            raise ResourceExhausted(
                f"job {job_id} has no budget left ({limit:g} s)",
                hint="`runner status` shows where it went; a contract with a new budget needs a "
                "new job id",
            )
        return float(limit)


def _apply(state: LedgerState, event: LedgerEvent) -> str | None:
    """Fold one event into the state; return what is wrong with its place, if anything."""
    d, t = event.data, event.type
    if event.seq == 0 and t != "job.accepted":
        return "the first event must be job.accepted"
    if t == "job.accepted":
        if state.accepted is not None:
            return "job.accepted appears twice"
        state.accepted = d
        return None
    if state.finished is not None and t != "job.rerun":
        return f"{t} after job.finished (only job.rerun may follow it)"
    if t == "job.rerun":
        if state.finished is None:
            return "job.rerun for a job that has not finished"
        state.finished = None
        state.reruns += 1
        return None
    current = state.in_flight
    if t == "attempt.starting":
        if current is not None:
            return f"attempt {d.get('attempt')} starts while attempt {current.number} is in flight"
        if d.get("attempt") != len(state.attempts) + 1:
            return (
                f"attempt {d.get('attempt')} is out of order (expected {len(state.attempts) + 1})"
            )
        at = parse_time(event.at) or datetime.now(UTC)
        state.attempts.append(Attempt(int(d["attempt"]), str(d["containerName"]), at, d))
        return None
    if t in {"attempt.started", "heartbeat", "attempt.finished"}:
        if current is None or current.number != d.get("attempt"):
            return f"{t} for attempt {d.get('attempt')}, which is not in flight"
        if t == "attempt.started":
            current.container_id = str(d["containerId"])
            current.started_at = parse_time(event.at)
        elif t == "heartbeat":
            current.seconds = float(d["attemptSeconds"])
            current.last_beat_at = parse_time(event.at)
        else:
            current.seconds = float(d["seconds"])
            current.finished = d
        return None
    if t == "budget.exhausted":
        return None
    if t == "agent.usage":
        n = d.get("attempt")
        if not isinstance(n, int) or not 1 <= n <= len(state.attempts):
            return f"agent.usage for attempt {n}, which the ledger does not have"
        if state.attempts[n - 1].finished is None:
            return f"agent.usage for attempt {n}, which has not finished"
        if n in state.agent_usage:
            return f"agent.usage for attempt {n} appears twice"
        state.agent_usage[n] = d
        return None
    if t == "job.finished":
        if current is not None:
            return f"job.finished while attempt {current.number} is in flight"
        state.finished = d
        return None
    return f"unknown event type {t}"


@dataclass(frozen=True)
class Problem:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def _scan(lines: list[bytes]) -> tuple[list[LedgerEvent], LedgerState, list[Problem]]:
    events: list[LedgerEvent] = []
    state = LedgerState()
    problems: list[Problem] = []
    seen: set[str] = set()
    prev: str | None = None
    for number, line in enumerate(lines, start=1):
        try:
            event = LedgerEvent.model_validate(jsondepth.loads(line))
        except (
            json.JSONDecodeError,
            jsondepth.TooDeep,
            UnicodeDecodeError,
            ValidationError,
        ) as exc:
            problems.append(Problem(number, f"not a ledger event: {str(exc).splitlines()[0]}"))
            prev = _line_hash(line)
            continue
        if event.seq != number - 1:
            problems.append(Problem(number, f"seq is {event.seq}, expected {number - 1}"))
        if event.prev != prev:
            problems.append(
                Problem(
                    number,
                    f"chain broken: prev is {event.prev} but line {number - 1} hashes to {prev} "
                    f"(line {number - 1} was changed, or a line was removed or inserted)",
                )
            )
        if event.eventId in seen:
            problems.append(Problem(number, f"eventId {event.eventId} appears twice"))
        seen.add(event.eventId)
        wrong = _apply(state, event)
        if wrong:
            problems.append(Problem(number, wrong))
        events.append(event)
        prev = _line_hash(line)
    return events, state, problems


class Ledger:
    """An open ledger: verified on open, appended with fsync."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[LedgerEvent] = []
        self.state = LedgerState()
        self._last_hash: str | None = None
        self._size = 0
        """The file's size after this ledger's last read or write: anything more is another
        writer's."""

    @classmethod
    def open(cls, path: Path) -> Ledger:
        """Open (creating if needed), recover a torn tail, and verify the whole chain."""
        ledger = cls(path)
        if not path.exists():
            return ledger
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
            side = path.with_name(f"{path.name}.torn-{stamp}")
            with side.open("xb") as f:
                f.write(data[cut:])
                f.flush()
                os.fsync(f.fileno())
            with path.open("r+b") as f:
                f.truncate(cut)
                f.flush()
                os.fsync(f.fileno())
            data = data[:cut]
        lines = data.splitlines()
        ledger.events, ledger.state, problems = _scan(lines)
        if problems:
            raise LedgerCorrupt(
                f"the ledger {path} is corrupt: {problems[0]}",
                hint=f"inspect it with `runner ledger verify {path.parent.parent}`; the job is "
                "left untouched until it is repaired",
            )
        ledger._last_hash = _line_hash(lines[-1]) if lines else None
        ledger._size = len(data)
        return ledger

    def reload(self) -> None:
        """Read the file again, verified as on open: what another writer appended (a fenced
        takeover's cancelled job recording its end) becomes this ledger's own last read."""
        fresh = Ledger.open(self.path)
        self.events, self.state = fresh.events, fresh.state
        self._last_hash, self._size = fresh._last_hash, fresh._size

    def check_owned(self) -> None:
        """Raise :class:`JobFenced` if anyone else has appended since this ledger's last read
        or write. (Opening the file, rather than a stat of its path, makes a network
        filesystem fetch its current size: NFS revalidates attributes on open.)"""
        if not self.path.exists() and self._size == 0:
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            self._fence(os.fstat(fd).st_size)
        finally:
            os.close(fd)

    def _fence(self, size: int) -> None:
        if size != self._size:
            raise JobFenced(
                f"the ledger {self.path} was written by another runner since this one's last "
                f"event ({size} bytes, {self._size} expected): another host took the job over",
                hint="this runner stops its container and writes nothing more; `runner status` "
                "shows the job as the ledger now tells it",
            )

    def append(self, event_id: str, type_: EventType, data: dict[str, Any]) -> LedgerEvent:
        """Append and fsync; the same ``event_id`` with the same data again is a no-op. A
        Ctrl-C or SIGTERM meanwhile is raised once the event and this ledger's account of it
        (its state, last hash and size) agree (runner.core.interrupts): raised between the
        write and the account, it made this runner take its own event for another's."""
        with interrupts.deferred():
            return self._append(event_id, type_, data)

    def _append(self, event_id: str, type_: EventType, data: dict[str, Any]) -> LedgerEvent:
        for old in self.events:
            if old.eventId == event_id:
                if old.type == type_ and old.data == data:
                    return old
                raise LedgerCorrupt(f"event {event_id} already exists with other content")
        event = LedgerEvent(
            seq=len(self.events),
            eventId=event_id,
            type=type_,
            at=_now(),
            prev=self._last_hash,
            data=data,
        )
        self.check_owned()  # before the state changes: a fenced runner's state stays true
        wrong = _apply(self.state, event)
        if wrong:
            raise LedgerCorrupt(f"refusing to append {type_}: {wrong}")
        line = json.dumps(event.model_dump(mode="json"), separators=(",", ":")).encode()
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            self._fence(os.fstat(fd).st_size)
            view = memoryview(line + b"\n")
            while view:  # a short write (a signal, a full disk) is written on, never left cut
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        self.events.append(event)
        self._last_hash = _line_hash(line)
        self._size += len(line) + 1
        return event


def read_state(path: Path) -> LedgerState:
    """The state from the complete lines of a ledger, changing nothing (for onlookers such as
    the sweeper; a runner uses :meth:`Ledger.open`)."""
    return state_of(path.read_bytes())


def state_of(data: bytes) -> LedgerState:
    """The state from the complete lines of a ledger's bytes (read by the caller: one of a
    folder it does not trust reads them without following a link, under a cap)."""
    lines = data.splitlines()
    if data and not data.endswith(b"\n"):
        lines = lines[:-1]
    return _scan(lines)[1]


def verify_file(path: Path) -> list[Problem]:
    """Every problem in the ledger at ``path`` (a torn last line is one), without changing it."""
    data = path.read_bytes()
    problems: list[Problem] = []
    lines = data.splitlines()
    if data and not data.endswith(b"\n"):
        problems.append(Problem(len(lines), "incomplete last line (a torn write)"))
        lines = lines[:-1]
    problems[:0] = _scan(lines)[2]
    return problems
