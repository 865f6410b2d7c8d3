"""What a job's GPUs did while it ran: NVML read at each of the resource sampler's samples.

:class:`NvmlReader` asks NVML (the ``nvidia-ml-py`` binding) for each device's utilisation
(the percent of the last sample period a kernel ran) and memory in use, by UUID; a
:class:`GpuUsage` adds the readings up per device: GPU seconds (utilisation integrated over
the time between readings), the most memory in use and the mean utilisation. The devices are
the job's alone (``runner.gpu.gpus.Allocator`` locks them), so what NVML says of a device is
the job's. A device NVML cannot read, or a value that is not a number in range, is absent,
never 0. Any reader with ``read`` and ``close`` (a fake in tests) takes NVML's place.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from runner.models.resources import GpuDeviceUse

__all__ = ["GpuReading", "GpuUsage", "NvmlReader", "UsageReader"]


@dataclass(frozen=True)
class GpuReading:
    uuid: str
    utilisation: float | None
    """0 to 1; None: not read."""
    memory_used_bytes: int | None


class UsageReader(Protocol):
    def read(self, uuids: Sequence[str]) -> list[GpuReading]:
        """One reading of each device (a device it cannot read: its values None)."""
        ...

    def close(self) -> None: ...


class NvmlReader:
    """NVML, initialised on the first read (in the sampler's thread, not the job's start)."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: dict[str, Any] = {}
        self._failed = False

    def _init(self) -> Any:
        if self._nvml is None and not self._failed:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception:  # noqa: BLE001 - no binding, no driver: no readings
                self._failed = True
        return self._nvml

    def read(self, uuids: Sequence[str]) -> list[GpuReading]:
        nvml = self._init()
        out = []
        for uuid in uuids:
            util: float | None = None
            used: int | None = None
            if nvml is not None:
                # NVMLError and friends: not read this time
                with contextlib.suppress(Exception):
                    handle = self._handles.get(uuid)
                    if handle is None:
                        handle = self._handles[uuid] = nvml.nvmlDeviceGetHandleByUUID(uuid)
                    util = _fraction(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                    used = _bytes(nvml.nvmlDeviceGetMemoryInfo(handle).used)
            out.append(GpuReading(uuid, util, used))
        return out

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None


def _fraction(percent: object) -> float | None:
    if not isinstance(percent, int | float) or isinstance(percent, bool):
        return None
    if math.isfinite(percent) and 0 <= percent <= 100:
        return float(percent) / 100
    return None


def _bytes(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**62:
        return value
    return None


@dataclass
class _Device:
    samples: int = 0
    utilisation_sum: float = 0.0
    gpu_seconds: float = 0.0
    memory_peak: int | None = None
    last: tuple[float, float] | None = None
    """(t, utilisation) of the last reading with a utilisation."""


@dataclass
class GpuUsage:
    """The readings of the job's devices, added up per device."""

    uuids: tuple[str, ...]
    devices: dict[str, _Device] = field(default_factory=dict)

    def add(self, t: float, readings: Sequence[GpuReading]) -> None:
        for r in readings:
            if r.uuid not in self.uuids:
                continue  # never a device the job was not given
            d = self.devices.setdefault(r.uuid, _Device())
            if r.memory_used_bytes is not None:
                d.memory_peak = max(d.memory_peak or 0, r.memory_used_bytes)
            if r.utilisation is None:
                continue
            d.samples += 1
            d.utilisation_sum += r.utilisation
            if d.last is not None and t > d.last[0]:  # the trapezoid since the last reading
                d.gpu_seconds += (t - d.last[0]) * (d.last[1] + r.utilisation) / 2
            d.last = (t, r.utilisation)

    def figures(self) -> list[GpuDeviceUse]:
        out = []
        for uuid in self.uuids:
            d = self.devices.get(uuid, _Device())
            read = d.samples > 0
            out.append(
                GpuDeviceUse(
                    uuid=uuid,
                    gpuSeconds=round(d.gpu_seconds, 3) if read else None,
                    memoryPeakBytes=d.memory_peak,
                    utilisationMean=round(d.utilisation_sum / d.samples, 4) if read else None,
                )
            )
        return out
