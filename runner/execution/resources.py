"""What an attempt's container used: the engine's counters, sampled while it runs.

An engine's counters of a container are gone once it has exited (Docker then answers zeros,
its cgroup removed), so they cannot be read once at the end: a :class:`Sampler` follows the
engine's stats stream (one connection for the whole attempt, about one answer a second, in a
thread of its own: the watching loop makes no call for it) and keeps, from each answer, the
figures of the attempt (the last of each counter, the most of each gauge) and a bounded time
series (:class:`Series`: at most ``SERIES_MAX_POINTS`` points whatever the length, the
resolution halved by merging neighbours in pairs when full). When the container has ended,
:meth:`Sampler.write` keeps both in ``record/attempts/<n>/resources.json``; the envelope reads
them from there (:func:`read_figures`) and sums them over the attempts (:func:`totals`).

Sampling is on by default and off with ``runner run --no-resource-sampling``
(:attr:`~runner.execution.options.RunOptions.resource_sampling`): then no stats stream is
opened at all, and the envelope's figures are absent. An attempt given GPUs has NVML read at
each sample too (:mod:`runner.gpu.usage`), in the same thread.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from runner.backends.base import Backend, LogFollow, StatsSample
from runner.core import clock, safefs
from runner.core.errors import RunnerError
from runner.models.envelope import AttemptRecord
from runner.models.resources import (
    SERIES_MAX_POINTS,
    AttemptResources,
    ResourceRecord,
    ResourceSeries,
    ResourceTotals,
)
from runner.state.jobdir import JobDir, write_json

if TYPE_CHECKING:  # imported for a GPU job's attempt only
    from runner.gpu.usage import UsageReader

__all__ = [
    "RECORD_NAME",
    "Point",
    "Sampler",
    "Sampling",
    "Series",
    "read_figures",
    "totals",
]

RECORD_NAME = "resources.json"
_RECORD_MAX_BYTES = 4 * 1024 * 1024
"""The most of a resources.json read back (256 points of six figures are under 64 KiB)."""


@dataclass(frozen=True)
class Point:
    """One point of a series: seconds since the container started, and the figures then."""

    t: float
    cpu_ns: int | None = None
    memory_bytes: int | None = None
    io_read_bytes: int | None = None
    io_write_bytes: int | None = None
    pids: int | None = None

    def merged(self, later: Point) -> Point:
        """This point and the ``later`` one as one: the later counters (CPU, I/O: they only
        grow), the larger gauges (memory, pids: a peak is never merged away), at ``later.t``."""

        def last(a: int | None, b: int | None) -> int | None:
            return b if b is not None else a

        def most(a: int | None, b: int | None) -> int | None:
            return b if a is None else a if b is None else max(a, b)

        return Point(
            later.t,
            last(self.cpu_ns, later.cpu_ns),
            most(self.memory_bytes, later.memory_bytes),
            last(self.io_read_bytes, later.io_read_bytes),
            last(self.io_write_bytes, later.io_write_bytes),
            most(self.pids, later.pids),
        )


@dataclass
class Series:
    """At most ``max_points`` points, ``interval`` seconds apart (at first 1 s). Each sample
    joins the pending point until the interval is over; when the points are ``max_points``,
    neighbours are merged in pairs and the interval doubles, so any length of run keeps its
    whole span at the finest resolution that fits."""

    max_points: int = SERIES_MAX_POINTS
    interval: float = 1.0
    points: list[Point] = field(default_factory=list)
    _pending: Point | None = None
    _pending_from: float = 0.0

    def __post_init__(self) -> None:
        if self.max_points < 2 or self.max_points % 2:
            raise ValueError(f"Series.max_points must be even and at least 2: {self.max_points}")

    def add(self, p: Point) -> None:
        if self._pending is None:
            self._pending, self._pending_from = p, p.t
            return
        if p.t - self._pending_from < self.interval:
            self._pending = self._pending.merged(p)
            return
        self._flush()
        self._pending, self._pending_from = p, p.t

    def _flush(self) -> None:
        if self._pending is None:
            return
        self.points.append(self._pending)
        self._pending = None
        if len(self.points) >= self.max_points:
            pts = self.points
            self.points = [pts[i].merged(pts[i + 1]) for i in range(0, len(pts) - 1, 2)]
            self.interval *= 2

    def finish(self) -> list[Point]:
        """Every point, the pending one included (never more than ``max_points``)."""
        self._flush()
        return list(self.points)

    def model(self) -> ResourceSeries:
        pts = self.finish()
        return ResourceSeries(
            intervalSeconds=self.interval,
            maxPoints=self.max_points,
            t=[round(p.t, 3) for p in pts],
            cpuSeconds=[_seconds(p.cpu_ns) for p in pts],
            memoryBytes=[p.memory_bytes for p in pts],
            ioReadBytes=[p.io_read_bytes for p in pts],
            ioWriteBytes=[p.io_write_bytes for p in pts],
            pids=[p.pids for p in pts],
        )


def _seconds(ns: int | None) -> float | None:
    return None if ns is None else round(ns / 1e9, 3)


@dataclass(frozen=True)
class Sampling:
    """How to account for one attempt: the engine and runtime it runs under (recorded with
    the figures) and the pids cap applied."""

    engine: str
    runtime: str
    pids_limit: int | None
    max_points: int = SERIES_MAX_POINTS
    gpus: tuple[str, ...] = ()
    """The UUIDs of the GPUs given to the attempt: read at each sample by ``gpu_reader``."""
    gpu_reader: UsageReader | None = field(default=None, compare=False)
    """NVML's (:class:`~runner.gpu.usage.NvmlReader`), or a test's; None: no GPU figures."""


class Sampler:
    """Follows the engine's stats stream of one container in a thread, from :meth:`start`
    until :meth:`stop` (or the container's end); the figures are as of the last answer."""

    STOP_WAIT = 5.0
    """The most seconds :meth:`stop` waits for the thread once its stream is closed."""

    def __init__(self, backend: Backend, container_id: str, how: Sampling, origin: float) -> None:
        self.backend, self.container_id, self.how, self.origin = backend, container_id, how, origin
        self.series = Series(how.max_points)
        self.samples = 0
        self.last_t: float | None = None
        self.error: str | None = None
        self._last = StatsSample()
        self._memory_most: int | None = None
        self._engine_peak: int | None = None
        self._pids_most: int | None = None
        self._gpu = None
        if how.gpus and how.gpu_reader is not None:
            from runner.gpu.usage import GpuUsage

            self._gpu = GpuUsage(how.gpus)
        self._lock = threading.Lock()
        self._handle = LogFollow()
        self._thread = threading.Thread(target=self._run, name="runner-stats", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self.backend.follow_stats(self.container_id, self.take, self._handle)
        except RunnerError as exc:  # figures stop here; the job is not the sampler's to end
            self.error = exc.message

    def take(self, s: StatsSample) -> None:
        """One answer of the engine (called from the sampler's thread, or a test's)."""
        t = max(clock.monotonic() - self.origin, 0.0)
        reader = self.how.gpu_reader
        readings = reader.read(self.how.gpus) if self._gpu is not None and reader else []

        def most(a: int | None, b: int | None) -> int | None:
            return b if a is None else a if b is None else max(a, b)

        with self._lock:
            self.samples += 1
            self.last_t = t
            last = self._last
            self._last = StatsSample(
                *(
                    new if new is not None else old
                    for new, old in zip(_fields(s), _fields(last), strict=True)
                )
            )
            self._memory_most = most(self._memory_most, s.memory_bytes)
            self._engine_peak = most(self._engine_peak, s.memory_peak_bytes)
            self._pids_most = most(self._pids_most, s.pids)
            self.series.add(
                Point(t, s.cpu_ns, s.memory_bytes, s.io_read_bytes, s.io_write_bytes, s.pids)
            )
            if self._gpu is not None:
                self._gpu.add(t, readings)

    def stop(self) -> None:
        """Close the stream and wait (bounded) for the thread."""
        self._handle.cancel()
        if self._thread.is_alive():
            self._thread.join(self.STOP_WAIT)
        if self.how.gpu_reader is not None and not self._thread.is_alive():
            self.how.gpu_reader.close()

    def figures(self, series: str | None = None) -> AttemptResources:
        with self._lock:
            last = self._last
            peak, source = self._engine_peak, "engine"
            if peak is None:
                peak, source = self._memory_most, "sampled"
            limit = last.memory_limit_bytes
            gvisor = self.how.runtime == "runsc"
            return AttemptResources(
                engine=self.how.engine,
                runtime=self.how.runtime,
                samples=self.samples,
                lastSampleSeconds=None if self.last_t is None else round(self.last_t, 3),
                cpuSeconds=_seconds(last.cpu_ns),
                cpuUserSeconds=_seconds(last.cpu_user_ns),
                cpuSystemSeconds=_seconds(last.cpu_system_ns),
                memoryPeakBytes=peak,
                memoryPeakSource=None if peak is None else source,  # type: ignore[arg-type]
                memoryLimitBytes=limit,
                memoryPeakFraction=round(peak / limit, 4) if peak is not None and limit else None,
                ioReadBytes=last.io_read_bytes,
                ioWriteBytes=last.io_write_bytes,
                pidsPeak=None if gvisor else self._pids_most,
                pidsLimit=self.how.pids_limit,
                gpus=self._gpu.figures() if self._gpu is not None else [],
                series=series,
            )

    def write(self, record_dir: Path, attempt: int) -> AttemptResources:
        """Keep the figures and the series in ``record_dir/resources.json`` (the folder
        ``record/attempts/<attempt>/`` of the job); the figures."""
        self.stop()
        record_dir.mkdir(parents=True, exist_ok=True)
        path = record_dir / RECORD_NAME
        rel = f"record/attempts/{attempt}/{RECORD_NAME}"
        with self._lock:
            series = self.series.model()
        figures = self.figures(rel)
        record = ResourceRecord(attempt=attempt, figures=figures, series=series)
        # Not fsynced: the envelope that hashes it is written (durably) next; a host crash
        # before then loses the figures, never the job's budget or result.
        write_json(path, record.model_dump(mode="json"), durable=False)
        return figures


def _fields(s: StatsSample) -> tuple[int | None, ...]:
    return (
        s.cpu_ns,
        s.cpu_user_ns,
        s.cpu_system_ns,
        s.memory_bytes,
        s.memory_peak_bytes,
        s.memory_limit_bytes,
        s.io_read_bytes,
        s.io_write_bytes,
        s.pids,
        s.pids_limit,
    )


def read_figures(job: JobDir, n: int) -> AttemptResources | None:
    """Attempt ``n``'s figures as its resources.json keeps them (a regular file, no link
    followed, capped); None when it has none (not sampled, or unreadable)."""
    rel = os.path.relpath(job.attempt_record(n) / RECORD_NAME, job.root)
    with contextlib.suppress(safefs.UnsafePath, OSError, ValidationError, ValueError):
        with safefs.open_under(job.root, rel) as f:
            data = f.read(_RECORD_MAX_BYTES + 1)
        if len(data) > _RECORD_MAX_BYTES:
            return None
        return ResourceRecord.model_validate_json(data).figures
    return None


def totals(attempts: Sequence[AttemptRecord]) -> ResourceTotals | None:
    """The figures over every attempt that has them: counters summed, peaks the most; a
    figure no attempt gave is null. None when no attempt has figures."""
    got = [a.resources for a in attempts if a.resources is not None]
    if not got:
        return None

    def total(values: list[float | int | None]) -> float | int | None:
        have = [v for v in values if v is not None]
        return sum(have) if have else None

    def most(values: list[float | int | None]) -> float | int | None:
        have = [v for v in values if v is not None]
        return max(have) if have else None

    cpu = total([r.cpuSeconds for r in got])
    return ResourceTotals(
        attempts=len(got),
        cpuSeconds=None if cpu is None else round(cpu, 3),
        memoryPeakBytes=most([r.memoryPeakBytes for r in got]),  # type: ignore[arg-type]
        memoryPeakFraction=most([r.memoryPeakFraction for r in got]),
        ioReadBytes=total([r.ioReadBytes for r in got]),  # type: ignore[arg-type]
        ioWriteBytes=total([r.ioWriteBytes for r in got]),  # type: ignore[arg-type]
        pidsPeak=most([r.pidsPeak for r in got]),  # type: ignore[arg-type]
    )
