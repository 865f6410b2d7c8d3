"""The container stage: one attempt's container, from create (or reattach) to removal.

create → start → watch against the runner's own deadline, with heartbeats → stop, then kill →
inspect → keep the engine's log → remove. After a runner crash, :func:`recover` finds the
attempt's container by its deterministic name and reattaches to it, or records how it ended.

Long on purpose: one container's whole life (its spec, the watch against the deadline and
the guards, the end kept, the removal, the recovery after a crash) reads in one place, where
each step's order is what keeps the ledger's promises.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import NoReturn, Protocol

from runner.backends.base import (
    Backend,
    Backstop,
    ContainerSpec,
    ContainerState,
    DeviceEdits,
    Mount,
)
from runner.core import clock, log
from runner.core.errors import (
    ContainerVanished,
    EngineUnavailable,
    GpuUnavailable,
    InfrastructureError,
    RunnerError,
)
from runner.execution.enginetime import EndWindow, on_this_clock, started_as_recorded, started_at
from runner.execution.lease import Lease
from runner.execution.resources import Sampler, Sampling
from runner.planning.plan import ExecutionPlan
from runner.state.jobdir import JobDir, write_json
from runner.state.ledger import Attempt, parse_time

__all__ = [
    "NotStarted",
    "Outcome",
    "Progress",
    "Removal",
    "Watch",
    "Watched",
    "backstop",
    "container_name",
    "finish",
    "recover",
    "run_attempt",
    "spec",
    "watch",
]


class Progress(Protocol):
    """What the orchestrator tells whoever watches (the CLI draws it for people)."""

    def stage(self, name: str, detail: str) -> None: ...

    def running(self, elapsed: float, budget: float) -> None: ...

    def transfer(self, label: str, done: int, total: int) -> None: ...


@dataclass(frozen=True)
class Stop:
    """The runner's stop of a container, for the ledger's ``attempt.finished``: the attempt's
    running seconds when the runner asked the engine to stop it, and the seconds until the
    engine said it had (SIGTERM, then SIGKILL after the grace), both counted as consumed."""

    at_seconds: float
    seconds: float

    def as_json(self) -> dict[str, float]:
        return {"atSeconds": round(self.at_seconds, 3), "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class Outcome:
    """How an attempt's container ended."""

    state: ContainerState
    container_id: str
    name: str
    run_seconds: float
    """This attempt's running time, as the runner measured it (across reattaches)."""
    timed_out: bool
    cancelled: bool
    how: str = "observed"
    """observed | recovered (ended while the runner was away) | ledger (read back)."""
    stopped_for: str | None = None
    """disk_quota_exceeded | log_limit_exceeded when the runner stopped it for a quota;
    agent.maxTurns | agent.maxBudgetUsd when an agent passed that limit."""
    stop: Stop | None = None
    """When the runner stopped it (the deadline, a quota, Ctrl-C), and how long that took."""


def container_name(job_root: Path, job_id: str, attempt: int) -> str:
    """Deterministic per (state dir, job, attempt): a restarted runner finds it again."""
    where = hashlib.sha256(str(job_root.resolve()).encode()).hexdigest()[:8]
    return f"runner-{job_id[:100]}-{where}-a{attempt}"


def backstop(budget_left: float, grace: float) -> Backstop:
    """The engine's own deadline for an attempt that may run ``budget_left`` seconds: past
    the runner's (which stops the job at the budget's end, then kills it after ``grace``),
    checked every tenth of the budget (1 s to 60 s), so that while no runner watches a job
    overruns its budget by at most ``grace`` + 2 s + that interval."""
    after = math.ceil(max(budget_left, 0.0) + grace) + 2
    return Backstop(after, min(max(math.ceil(budget_left / 10), 1), 60))


def spec(
    p: ExecutionPlan,
    job: JobDir,
    image_id: str,
    attempt: int,
    gpu_ids: tuple[str, ...] = (),
    deadline: Backstop | None = None,
    network: str | None = None,
    *,
    argv: tuple[str, ...] | None = None,
    secrets: dict[str, str] | None = None,
    devices: DeviceEdits | None = None,
    assets: Sequence[Mount] = (),
) -> ContainerSpec:
    """The attempt's container. Without GPUs, NVIDIA_VISIBLE_DEVICES=void keeps a GPU-aware
    runtime from exposing devices even when the image asks for them. ``network``: another
    than the plan's (the egress allowlist's ``container:<holder>``). An agent's attempt has
    its own ``argv`` (its limits left) and the host's ``secrets`` in its environment only.
    ``assets``: the contract's assets, read-only, at /job/assets/<path>. ``devices``: CDI
    devices; applied by the runner (``cdi-applied``), their mounts join the job's (read-only)
    and their environment wins over the contract's, as under an engine that applies CDI
    itself."""
    applied = devices if devices is not None and devices.mode == "cdi-applied" else None
    return ContainerSpec(
        backstop=deadline,
        network=network,
        name=container_name(job.root, p.job_id, attempt),
        image=image_id,
        entrypoint=p.entrypoint,
        command=list(p.argv if argv is None else argv),
        user=p.user,
        working_dir=p.working_dir,
        environment={
            **p.environment,
            "RUNNER_ATTEMPT": str(attempt),
            "NVIDIA_VISIBLE_DEVICES": ",".join(gpu_ids) or "void",
            **dict(applied.env if applied else ()),
            **(secrets or {}),
        },
        gpu_ids=gpu_ids,
        devices=devices,
        labels={
            **p.labels,
            "org.runner.attempt": str(attempt),
            "org.runner.job-dir": str(job.root.resolve()),
        },
        mounts=[
            Mount(job.input, "/job/input", read_only=True),
            Mount(job.output, "/job/output", read_only=False),
            Mount(job.workspace, "/job/workspace", read_only=False),
            Mount(job.runtime_cache, "/job/runtime-cache", read_only=False),
            Mount(job.runtime_venv, "/job/runtime-venv", read_only=False),
            Mount(job.assets, "/job/assets", read_only=True),
            Mount(job.execution, "/job/execution", read_only=True),
            *assets,  # read-only, each over its mount point in assets/ (the engine sorts them)
            *(Mount(Path(h), c, read_only=True) for h, c in (applied.mounts if applied else ())),
        ],
        limits=p.limits,
    )


@dataclass(frozen=True)
class Watch:
    """How to watch one attempt."""

    budget_left: float
    """Seconds this attempt may still run (the job's limit minus all consumption so far)."""
    already: float
    """Seconds this attempt had run before this watch (a reattach)."""
    consumed_before: float
    """Seconds of earlier attempts, for the progress display."""
    limit: float
    grace: float
    tick: float
    heartbeat: float
    on_beat: Callable[[float, bool], None]
    """Called with the attempt's running seconds at each heartbeat, and whether it is the one
    a reattaching runner writes at once (what it charged for the time no runner watched)."""
    as_of: float | None = None
    """The ``clock.monotonic()`` at which ``already`` and ``budget_left`` held (when the
    container started, or when :func:`recover` charged it); None: when the watch begins. The
    time between is counted, so the deadline is the budget's end, not that plus the gap."""
    guard: Callable[[], str | None] = lambda: None
    """Checked every tick: a reason to stop the job (a quota), or None."""
    breached: Callable[[], str | None] = lambda: None
    """Checked once at the deadline: a quota already broken, measured at once."""
    on_start: Callable[[str], None] = lambda container_id: None
    """Called with the container's id once it runs, before the first tick (an agent's guard
    follows its stdout in the engine from then on)."""
    sampling: Sampling | None = None
    """Follow the engine's stats of the container while it runs (``runner.execution.resources``);
    None: no stats stream is opened."""
    engine_clock_agrees: bool = False
    """The engine's clock was found to agree with this host's (its ``StartedAt`` fell within
    the start call, or on a reattach was where the ledger's heartbeats put the start:
    :func:`~runner.execution.enginetime.started_as_recorded`): a container
    that ends by itself is then charged to the engine's ``FinishedAt`` (:class:`EndWindow`),
    else to the moment the runner learnt of its end."""
    lease: float = 0.0
    """Seconds the attempt may go without a heartbeat written before the container is removed
    (:class:`~runner.execution.lease.Lease`), so that a runner that can no longer prove it is
    alive never runs the job beside another host's; 0: no such limit."""


@dataclass(frozen=True)
class Watched:
    timed_out: bool
    cancelled: bool
    seconds: float
    """The attempt's running seconds (across reattaches), to the moment the runner learnt of
    its end or stopped it."""
    stopped_for: str | None
    """The guard's reason when the runner stopped it for a quota."""
    stop: Stop | None = None
    sampler: Sampler | None = None
    """What the engine's counters said while it ran (stopped; written by :func:`finish`)."""
    ended_by_itself: EndWindow | None = None
    """Set when the container ended by itself (no stop, timeout or Ctrl-C): :func:`finish`
    then charges it to the engine's ``FinishedAt`` within this window."""


def watch(
    backend: Backend, container_id: str, w: Watch, progress: Progress, *, interrupted: bool = False
) -> Watched:
    """Wait for the container against the deadline and the guards (quotas). The deadline is
    checked before anything else each time the loop wakes (at the latest every tick), so the
    stop is asked for at the budget's end, not after a quota walk or a heartbeat write; a
    reattaching runner writes a heartbeat at once, before it stops a job whose budget ran
    out while no runner watched. ``interrupted``: a Ctrl-C came while it started, so it is
    stopped at once, as for one during the watch."""
    start = w.as_of if w.as_of is not None else clock.monotonic()
    origin = start - w.already
    deadline = start + w.budget_left
    next_beat = start + w.heartbeat
    timed_out = cancelled = False
    stopped_for = None
    stop: Stop | None = None
    lease = Lease(backend, container_id, w.lease)
    sampler: Sampler | None = None

    def stop_it() -> None:
        nonlocal stop
        asked = clock.monotonic()
        try:
            backend.stop(container_id, w.grace)
        finally:
            stop = Stop(asked - origin, clock.monotonic() - asked)

    def beat(reattached: bool = False) -> None:
        try:
            w.on_beat(clock.monotonic() - origin, reattached)
        except (RunnerError, OSError):
            # Fenced (another host took the job over), or the ledger cannot be written:
            # this runner can no longer account for the job, so the job stops now.
            lease.stop()
            backend.remove(container_id)
            raise
        if lease.fired:  # the write came back only after the lease had run out
            raise lease.lost()
        lease.last_ok = clock.monotonic()

    try:
        w.on_start(container_id)  # an agent's guard follows it even so: its turns count
        if interrupted:
            raise KeyboardInterrupt
        if w.sampling is not None:  # its own thread and connection: no call in this loop
            sampler = Sampler(backend, container_id, w.sampling, origin).start()
        if w.already > 0:
            beat(reattached=True)
        while True:
            if lease.fired:
                raise lease.lost()
            now = clock.monotonic()
            if now >= deadline:
                if backend.wait(container_id, 0.01) is not None:
                    break  # it ended within the last tick: not a timeout
                # A quota broken before the deadline (while no runner watched, say) is what
                # happened first; the budget's end is recorded as the stop either way.
                stopped_for = w.breached()
                timed_out = True
                stop_it()
                break
            wait_for = min(w.tick, deadline - now, max(next_beat - now, 0.01))
            if backend.wait(container_id, wait_for) is not None:
                break
            if clock.monotonic() >= deadline:
                continue  # the budget's end first: no quota walk or heartbeat before the stop
            stopped_for = w.guard()
            if stopped_for is not None:
                stop_it()
                break
            if clock.monotonic() >= next_beat:
                beat()
                next_beat = clock.monotonic() + w.heartbeat
            progress.running(w.consumed_before + clock.monotonic() - origin, w.limit)
    except KeyboardInterrupt:
        cancelled = True
        stop_it()
    except Exception:  # the engine's view of a container the lease removed, say
        if lease.fired:
            raise lease.lost() from None
        raise
    finally:
        # The container has ended (or was stopped) here: what follows is the runner's own
        # bookkeeping (the lease thread joined, the stats stream closed), not the job's time.
        ended = clock.monotonic()
        lease.stop()
        if sampler is not None:
            sampler.stop()
    if lease.fired:
        raise lease.lost()
    seconds = round(ended - origin, 3)
    by_itself = None
    if w.engine_clock_agrees and not (timed_out or cancelled or stop is not None):
        by_itself = EndWindow(origin, start, ended)
    return Watched(timed_out, cancelled, seconds, stopped_for, stop, sampler, by_itself)


def finish(
    backend: Backend,
    container_id: str,
    name: str,
    record_dir: Path,
    *,
    watched: Watched,
    how: str = "observed",
    log_max_bytes: int = 1024 * 1024,
) -> Outcome:
    """Make sure it is dead and keep its final state and engine log. The container is left for
    the caller to remove once the attempt's end is in the ledger: a runner dying in between
    then finds the end recorded, not a vanished container to run again."""
    state = backend.state(container_id)
    seconds = watched.seconds
    if state.running:
        backend.kill(container_id)
        state = backend.state(container_id)
    elif watched.ended_by_itself is not None:  # to the engine's own end, not our learning of it
        seconds = watched.ended_by_itself.seconds(state.finished_at)
    state = _oom_unflagged(backend, container_id, state, watched)
    record_dir.mkdir(parents=True, exist_ok=True)
    write_json(record_dir / "container-state.json", state.raw)
    if watched.sampler is not None:  # record/attempts/<n>/resources.json
        watched.sampler.write(record_dir, _attempt_of(record_dir))
    # The engine's log is a convenience; the job's own logs are in output/.
    with contextlib.suppress(InfrastructureError):
        backend.save_logs(container_id, record_dir / "engine.log", log_max_bytes)
    return Outcome(
        state,
        container_id,
        name,
        seconds,
        watched.timed_out,
        watched.cancelled,
        how,
        watched.stopped_for,
        watched.stop,
    )


def _oom_unflagged(
    backend: Backend, container_id: str, state: ContainerState, watched: Watched
) -> ContainerState:
    """``state``, with ``OOMKilled`` where the engine did not set it though it logged the
    container's ``oom`` event: a job killed by SIGKILL (137) that the runner did not stop.
    Docker sets the flag only when the kernel's OOM event reaches it before the exit's; under
    load on cgroup v1 it came after, and a job killed at its memory cap read as a plain exit
    137. The engine's own record (``container-state.json``) is kept as it said."""
    stopped = watched.stop is not None or watched.timed_out or watched.cancelled
    if state.running or state.exit_code != 137 or state.oom_killed or stopped:
        return state
    started = parse_time(state.started_at)
    try:
        logged = backend.oom_logged(container_id, started.timestamp() - 1 if started else 0.0)
    except (RunnerError, OverflowError, ValueError):
        return state
    return replace(state, oom_killed=True) if logged else state


class Removal:
    """An ended container being removed (``backend.remove``) in a thread of its own, while the
    runner reads the job's evidence: the engine's removal (about 8 ms) off the job's wall
    time. The runner starts it (:meth:`start`) where it removed the container before (its end
    just in the ledger) and waits for it before the envelope is written (:meth:`wait`), so a
    removal that fails ends the job as it did then; on every other way out it waits for it
    too (:meth:`wait_quietly`): a batch's or a server's fork ends with ``os._exit``, which
    would cut a removal still in flight. Without a thread to be had, it removes at once."""

    def __init__(self, backend: Backend, container_id: str) -> None:
        self._backend = backend
        self._container = container_id
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._done = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._remove, name="runner-remove")
        try:
            self._thread.start()
        except RuntimeError:  # no thread to be had (the host's limit): removed here and now
            self._thread = None
            self._remove()

    def _remove(self) -> None:
        try:
            self._backend.remove(self._container)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter, raised there
            self._error = exc
        finally:
            self._done.set()

    def wait(self) -> None:
        """Wait for the removal and raise its error, once. A Ctrl-C (or SIGTERM) meanwhile
        does not cut the wait short: it is raised once the removal is done. (An event, not
        ``Thread.join``: on Python 3.11 a join interrupted by a signal marks a thread that
        still runs as stopped.)"""
        interrupted: KeyboardInterrupt | None = None
        thread = self._thread  # None: never started, or removed at once
        while not self._done.is_set() and thread is not None and thread.is_alive():
            try:
                self._done.wait(1.0)
            except KeyboardInterrupt as exc:
                interrupted = exc
        error, self._error = self._error, None
        if interrupted is not None:
            if error is not None:
                interrupted.add_note(self._not_removed(error))
            raise interrupted
        if error is not None:
            raise error

    def wait_quietly(self, cause: BaseException) -> None:
        """Wait for the removal on the way out with ``cause``: what the removal raised is
        logged and noted on ``cause``, which is what the run says."""
        try:
            self.wait()
        except KeyboardInterrupt:
            pass  # the removal was waited for; the run ends with its cause all the same
        except Exception as exc:  # noqa: BLE001 - said, not raised: the cause is what ends the run
            note = self._not_removed(exc)
            log.event(logging.WARNING, note, stage="container")
            cause.add_note(note)

    def _not_removed(self, error: BaseException) -> str:
        return (
            f"the container {self._container} was not removed: {error} (`runner job cleanup` "
            "removes the containers of ended attempts)"
        )


def _attempt_of(record_dir: Path) -> int:
    """The attempt a ``record/attempts/<n>`` folder is of (0 for any other folder)."""
    return int(record_dir.name) if record_dir.name.isdigit() else 0


class NotStarted(Exception):
    """An attempt whose container never started; ``cause`` is why. Its container is removed."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def run_attempt(
    backend: Backend,
    container: ContainerSpec,
    w: Watch,
    record_dir: Path,
    progress: Progress,
    on_created: Callable[[str], None],
) -> Outcome:
    """A new attempt: create, record its id (``on_created``), start, watch, finish.

    Raises :class:`NotStarted` when the container never ran (it is removed). Once it runs, an
    unreachable engine leaves it in place and in flight: the next `runner run` reattaches."""
    try:
        container_id = backend.create(container)
    except (RunnerError, KeyboardInterrupt) as exc:
        raise NotStarted(exc) from exc
    before: float | None = None
    interrupted = False
    try:
        on_created(container_id)
        before = clock.monotonic()
        backend.start(container_id)
        as_of, agrees = started_at(backend, container_id, before, clock.monotonic())
        w = replace(w, as_of=as_of, engine_clock_agrees=agrees)
    except (RunnerError, KeyboardInterrupt) as exc:
        ran = None
        if isinstance(exc, KeyboardInterrupt | EngineUnavailable) and before is not None:
            unsure = exc if isinstance(exc, EngineUnavailable) else None
            ran = _ran_since(backend, container_id, before, unsure=unsure)
        if ran is None:
            _remove_unstarted(backend, container_id, container, exc)
        # The engine had started it: a Ctrl-C that came in the start call's answer or in the
        # look at its StartedAt stops it and charges it as a cancel; a start call that timed
        # out (an engine slow to answer) is watched as any start, from its StartedAt.
        w, interrupted = replace(w, as_of=ran), isinstance(exc, KeyboardInterrupt)
    try:
        watched = watch(backend, container_id, w, progress, interrupted=interrupted)
    except EngineUnavailable:
        raise  # the container may well run on; the ledger keeps it in flight for a reattach
    except BaseException:
        backend.remove(container_id)
        raise
    return finish(
        backend,
        container_id,
        container.name,
        record_dir,
        watched=watched,
        log_max_bytes=container.log_max_bytes,
    )


def _ran_since(
    backend: Backend, container_id: str, before: float, *, unsure: EngineUnavailable | None = None
) -> float | None:
    """After a Ctrl-C during an attempt's start, or a start call the engine did not answer in
    time: when its container started, on this host's clock (the engine's ``StartedAt``, when
    it falls between ``before`` and now, as it must when the engine's clock agrees with this
    host's), or None when the engine says it never did. An engine whose clock disagrees is
    taken to have started it at ``before``: no moment it may have run goes uncharged. One that
    cannot say: after a Ctrl-C, ``before`` too (it is stopped at once); after a start call it
    did not answer (``unsure``), that error is raised, leaving the attempt in flight for the
    next run to find the container as it is (a container never started is no running one:
    watched, the engine's ``wait`` would answer 0 for it at once)."""
    try:
        state = backend.state(container_id)
    except ContainerVanished:
        return None
    except RunnerError:
        if unsure is not None:
            raise unsure from None
        return before
    if parse_time(state.started_at) is None:
        return None if state.status == "created" else before
    now = clock.monotonic()
    mapped = on_this_clock(state.started_at, before - 1.0, now + 1.0)
    return mapped if before <= mapped <= now else before  # a clock that disagrees: `before`


def _remove_unstarted(
    backend: Backend, container_id: str, container: ContainerSpec, exc: BaseException
) -> NoReturn:
    """Remove a container that never ran, and raise :class:`NotStarted` with why."""
    backend.remove(container_id)
    if isinstance(exc, GpuUnavailable) and container.gpu_ids:  # name the devices asked for
        exc = GpuUnavailable(
            "the engine could not start the container with GPU(s) "
            f"{', '.join(container.gpu_ids)}: {exc.message}",
            hint=exc.hint,
        )
    raise NotStarted(exc) from exc


@dataclass(frozen=True)
class Found:
    """What :func:`recover` learnt about an attempt left in flight."""

    state: ContainerState | None
    """None: the container is gone."""
    seconds: float
    """The attempt's running time up to now (running) or to its end (exited), never less."""
    at: float
    """The ``clock.monotonic()`` at which ``seconds`` held (for a reattach's deadline)."""
    engine_clock_agrees: bool = False
    """The engine's ``StartedAt`` is where the ledger's last heartbeat puts the attempt's
    start, as it is when the engine's clock agrees with this host's
    (:func:`~runner.execution.enginetime.started_as_recorded`,
    :attr:`Watch.engine_clock_agrees`)."""


def recover(backend: Backend, attempt: Attempt, now: datetime | None = None) -> Found:
    """Find an in-flight attempt's container after a runner crash and account for its time.

    Running: it ran from the last heartbeat until now. Exited: from the last heartbeat until
    the engine's FinishedAt where its clock agrees with this host's (:func:`started_as_recorded`),
    else the engine's own StartedAt to FinishedAt (never less than the ledger had). Gone, or no
    usable time: until now, so the budget is never under-counted (it may be over-counted by the
    time the runner was away)."""
    at = clock.monotonic()
    now = now or clock.now()
    since = attempt.last_beat_at or attempt.starting_at
    try:
        state = backend.state(attempt.container_name)
    except ContainerVanished:
        return Found(None, attempt.seconds + max((now - since).total_seconds(), 0.0), at)
    if state.running or state.status in {"restarting", "paused"}:
        agrees = started_as_recorded(state.started_at, attempt.last_beat_at, attempt.seconds)
        seconds = attempt.seconds + max((now - since).total_seconds(), 0.0)
        return Found(state, seconds, at, agrees)
    if state.status == "created":
        return Found(state, attempt.seconds, at)
    ended, started = parse_time(state.finished_at), parse_time(state.started_at)
    agrees = started_as_recorded(state.started_at, attempt.last_beat_at, attempt.seconds)
    if ended is not None and ended >= since and agrees:
        seconds = attempt.seconds + (ended - since).total_seconds()
    elif ended is not None and started is not None and ended >= started:
        # The engine's clock is not known to agree with this host's (an engine 500 s behind
        # made a job that ran 900 s unwatched cost 400 s): its own start to its own end, one
        # clock, and never less than the ledger had.
        seconds = max(attempt.seconds, (ended - started).total_seconds())
    else:
        seconds = attempt.seconds + max((now - since).total_seconds(), 0.0)
    return Found(state, seconds, at)
