"""What a run knows so far, and where it stopped: values passed from stage to stage.

Stages take values and return values. :class:`Known` is the frozen record of what the stages
before have produced (the contract, the plan, the job folder, the image, the GPUs ...); a
stage that fails raises :class:`Stopped`, naming itself and carrying what was known, so the
envelope of a failed run reports exactly what the run got to. Nothing here is mutated after
it is made: a later stage makes a new :class:`Known` with :func:`dataclasses.replace`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from runner.core import log
from runner.models.envelope import (
    AgentRecord,
    AgentUsageRecord,
    Allocation,
    BudgetRecord,
    EgressRecord,
    EngineRecord,
    GpuRecord,
    ImageRecord,
    Stage,
)

if TYPE_CHECKING:
    from runner.contract import VerifiedContract
    from runner.execution.container import Outcome, Progress
    from runner.models.envelope import ResultEnvelope
    from runner.planning.plan import ExecutionPlan
    from runner.state.jobdir import JobDir

__all__ = ["Clock", "Known", "Logged", "Silent", "Stopped", "log_end", "now_iso", "stage"]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Clock:
    """When a run started (wall clock for the envelope, monotonic for durations)."""

    started_at: str
    t0: float

    @staticmethod
    def start() -> Clock:
        return Clock(now_iso(), time.monotonic())

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 3)


@dataclass(frozen=True)
class Known:
    """What the stages of a run have produced so far."""

    contract: VerifiedContract | None = None
    plan: ExecutionPlan | None = None
    job: JobDir | None = None
    image: ImageRecord | None = None
    engine: EngineRecord | None = None
    """The engine that ran (or runs) the attempt's container."""
    gpus: tuple[GpuRecord, ...] = ()
    gpu_fallback: str | None = None
    """Why a contract asking for GPUs runs on CPU only."""
    warnings: tuple[str, ...] = ()
    seconds: Mapping[str, float] = field(default_factory=dict)
    """Durations of the timed stages (``stage``, ``image``)."""
    outcome: Outcome | None = None
    """How the attempt's container ended."""
    budget: BudgetRecord | None = None
    allocation: Allocation | None = None
    """What the attempt that produced the result was given (its compute-decision.json)."""
    agent: AgentRecord | None = None
    """An agent_planned run's agent, as it ran."""
    agent_usage: AgentUsageRecord | None = None
    """Its turns and cost so far, from the ledger."""
    written: bool = False
    """The run's envelope is in the job folder already: a later failure must not replace it."""
    egress: EgressRecord | None = None
    """The attempt's egress allowlist, its connections read from the proxy's log."""

    def timed(self, key: str, since: float) -> Known:
        """This record with stage ``key`` timed from ``since`` (monotonic) to now."""
        return replace(self, seconds={**self.seconds, key: round(time.monotonic() - since, 3)})


class Stopped(Exception):
    """A stage failed: ``cause`` is why (a RunnerError, a runner bug, or KeyboardInterrupt for
    Ctrl-C), ``stage`` where, ``known`` what the run had produced by then."""

    def __init__(self, stage: Stage, cause: BaseException, known: Known) -> None:
        super().__init__(f"{stage}: {cause!r}")
        self.stage = stage
        self.cause = cause
        self.known = known


@contextlib.contextmanager
def stage(name: Stage, known: Known) -> Iterator[None]:
    """Run a stage: an error or Ctrl-C inside it becomes :class:`Stopped` with its name and
    ``known``. A :class:`Stopped` from a stage nested inside passes through unchanged, and so
    does anything that is neither an error nor Ctrl-C (the process is going away)."""
    job_id = known.plan.job_id if known.plan else None
    log.event(logging.DEBUG, f"{name}: begins", jobId=job_id, stage=name)
    try:
        yield
    except Stopped:
        raise
    except (Exception, KeyboardInterrupt) as exc:
        category = getattr(
            exc, "category", "cancelled" if isinstance(exc, KeyboardInterrupt) else None
        )
        log.event(
            logging.WARNING, f"{name}: stopped: {exc}", jobId=job_id, stage=name, category=category
        )
        raise Stopped(name, exc, known) from exc


class Silent:
    """Progress nobody watches."""

    def stage(self, name: str, detail: str) -> None:
        pass

    def running(self, elapsed: float, budget: float) -> None:
        pass

    def transfer(self, label: str, done: int, total: int) -> None:
        pass


class Logged:
    """Progress that is also logged (``runner --log-level info``), with the job's id once
    it is known (a new wrapper then; nothing is changed in place)."""

    def __init__(self, inner: Progress, job_id: str | None = None) -> None:
        self.inner = inner
        self.job_id = job_id

    def stage(self, name: str, detail: str) -> None:
        log.event(logging.INFO, detail, jobId=self.job_id, stage=name)
        self.inner.stage(name, detail)

    def running(self, elapsed: float, budget: float) -> None:
        self.inner.running(elapsed, budget)

    def transfer(self, label: str, done: int, total: int) -> None:
        self.inner.transfer(label, done, total)


def log_end(envelope: ResultEnvelope) -> None:
    """The run's last log event: how it ended."""
    failure = envelope.failure
    log.event(
        logging.INFO if failure is None else logging.WARNING,
        f"job {envelope.status}" + (f": {failure.reason}" if failure else ""),
        jobId=envelope.jobId,
        stage=failure.stage if failure else None,
        attempt=envelope.attempt,
        category=failure.category if failure else None,
        seconds=envelope.timings.totalSeconds,
    )
