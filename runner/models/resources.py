"""What an attempt's container used, as the engine's own counters said while it ran.

``record/attempts/<n>/resources.json`` (:class:`ResourceRecord`: the figures and the bounded
time series) is written by :mod:`runner.execution.resources` when an attempt's container ends;
the envelope carries each attempt's figures (:class:`AttemptResources`, in
``attempts[].resources``) and their totals (:class:`ResourceTotals`, in ``resources``).

Every figure is as the engine reported it in its last answer while the container ran (an
engine's counters of a container are gone once it has exited: Docker answers zeros), so a
figure is a lower bound, at most ``lastSampleSeconds`` short of the end, and a figure the
engine did not give is null, never 0.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "SERIES_MAX_POINTS",
    "AttemptResources",
    "GpuDeviceUse",
    "ResourceRecord",
    "ResourceSeries",
    "ResourceTotals",
]

SERIES_MAX_POINTS = 256
"""The most points a series keeps, whatever the attempt's length: past it, neighbouring
points are merged in pairs and the interval between points doubles."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuDeviceUse(_Model):
    """One GPU's use by an attempt, NVML read at each sample (``runner.gpu.usage``); the
    device is the job's alone, so NVML's word on it is the job's."""

    uuid: str = Field(description="The device's UUID, as in gpus[].uuid.")
    gpuSeconds: float | None = Field(
        ge=0,
        description="Seconds the device was busy: NVML's utilisation (the share of its last "
        "sample period a kernel ran) integrated over the time between samples.",
    )
    memoryPeakBytes: int | None = Field(ge=0, description="The most device memory seen in use.")
    utilisationMean: float | None = Field(description="Mean utilisation over the samples, 0 to 1.")


class AttemptResources(_Model):
    """One attempt's use of CPU, memory, I/O and processes, from the engine's counters.

    Null is "the engine did not say" (cgroup v2 has no peak memory in Docker's stats; I/O
    counters are empty where the block controller does not account the device; no sample came
    before the container ended), never 0."""

    engine: str = Field(description="The engine that answered: docker, podman (fake in tests).")
    runtime: str = Field(description="runc, or runsc (gVisor: the figures include the sandbox).")
    samples: int = Field(ge=0, description="Answers read from the engine while the container ran.")
    lastSampleSeconds: float | None = Field(
        ge=0,
        description="When the last of them was read, in seconds since the container started "
        "(the figures hold as of then); null: none was.",
    )
    cpuSeconds: float | None = Field(
        ge=0,
        description="CPU time, user and system together (cgroup v1 cpuacct.usage; v2 "
        "cpu.stat usage_usec), as of the last sample.",
    )
    cpuUserSeconds: float | None = Field(ge=0, description="Of which user time (ticks of 10 ms).")
    cpuSystemSeconds: float | None = Field(
        ge=0, description="Of which system time (ticks of 10 ms)."
    )
    memoryPeakBytes: int | None = Field(
        ge=0,
        description="The most memory charged to the container, page cache included: the "
        "engine's own peak (cgroup v1 memory.max_usage_in_bytes) where it gives one, else the "
        "most of the sampled usage (memoryPeakSource says which).",
    )
    memoryPeakSource: Literal["engine", "sampled"] | None = Field(
        description="engine: the kernel's peak counter; sampled: the most of the samples (a "
        "lower bound: a peak between two samples is missed)."
    )
    memoryLimitBytes: int | None = Field(
        ge=0, description="The memory cap, as the engine reports it."
    )
    memoryPeakFraction: float | None = Field(
        ge=0, description="memoryPeakBytes / memoryLimitBytes: how close it came to the cap."
    )
    ioReadBytes: int | None = Field(
        ge=0,
        description="Bytes read from block devices (blkio io_service_bytes, summed over devices).",
    )
    ioWriteBytes: int | None = Field(
        ge=0,
        description="Bytes written to block devices (under cgroup v1, buffered writes the "
        "kernel writes back later are not charged to the container).",
    )
    pidsPeak: int | None = Field(
        ge=0,
        description="The most processes (tasks) seen at one sample; null under runsc, where "
        "the engine counts the sandbox's threads, not the job's processes.",
    )
    pidsLimit: int | None = Field(ge=0, description="The pids cap, as applied (null: none).")
    gpus: list[GpuDeviceUse] = Field(
        default_factory=list, description="Per GPU given to the attempt ([] without GPUs)."
    )
    series: str | None = Field(
        default=None,
        description="The time series, relative to the job folder "
        "(record/attempts/<n>/resources.json); null when none was written.",
    )


class ResourceSeries(_Model):
    """The time series of one attempt: parallel lists, one entry a point, oldest first. A
    point merges the samples of ``intervalSeconds``: the last of each counter (CPU, I/O), the
    most of each gauge (memory, pids)."""

    intervalSeconds: float = Field(description="Seconds between points (doubles when full).")
    maxPoints: int = Field(description="The most points kept.")
    t: list[float] = Field(description="Seconds since the container started.")
    cpuSeconds: list[float | None]
    memoryBytes: list[int | None] = Field(description="Memory charged (page cache included).")
    ioReadBytes: list[int | None]
    ioWriteBytes: list[int | None]
    pids: list[int | None]


class ResourceRecord(_Model):
    """``record/attempts/<n>/resources.json``."""

    schemaVersion: Literal["1.0"] = "1.0"
    attempt: int
    figures: AttemptResources
    series: ResourceSeries


class ResourceTotals(_Model):
    """Over every attempt with figures: sums of the counters, the most of the peaks."""

    attempts: int = Field(ge=0, description="Attempts with figures (those sampled).")
    cpuSeconds: float | None = Field(ge=0, description="Sum over those attempts.")
    memoryPeakBytes: int | None = Field(ge=0, description="The most of their peaks.")
    memoryPeakFraction: float | None = Field(ge=0, description="The most of their fractions.")
    ioReadBytes: int | None = Field(ge=0, description="Sum over those attempts.")
    ioWriteBytes: int | None = Field(ge=0, description="Sum over those attempts.")
    pidsPeak: int | None = Field(ge=0, description="The most of their peaks.")
