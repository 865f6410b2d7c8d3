"""One answer of an engine's container stats (``GET /containers/{id}/stats``), as figures.

Docker and Podman's compatible API answer the same shape; what each field is depends on the
host's cgroup version:

- ``cpu_stats.cpu_usage.total_usage`` (ns): v1 ``cpuacct.usage``; v2 ``cpu.stat`` usage_usec.
- ``usage_in_usermode`` / ``usage_in_kernelmode`` (ns): v1 ``cpuacct.stat`` (ticks of 10 ms);
  v2 ``cpu.stat`` user_usec / system_usec.
- ``memory_stats.usage``: v1 ``memory.usage_in_bytes`` (page cache included); v2
  ``memory.current``.
- ``memory_stats.max_usage``: v1 ``memory.max_usage_in_bytes``, the kernel's peak; v2: not
  given (the engine does not read ``memory.peak``), so the peak is the most sampled usage.
- ``memory_stats.limit``: v1 ``memory.limit_in_bytes``; v2 ``memory.max``.
- ``blkio_stats.io_service_bytes_recursive``: v1 ``blkio.throttle.io_service_bytes`` (or CFQ's
  where present; empty where the controller accounts nothing); v2 ``io.stat`` rbytes / wbytes.
- ``pids_stats.current`` / ``limit``: ``pids.current`` / ``pids.max`` on both.

Podman's own stream (``/libpod/containers/stats``: its Docker-compatible one, in 4.3, answers
once and then nothing until the container has ended) gives ``CPUNano``, ``CPUSystemNano``,
``MemUsage``, ``MemLimit``, ``BlockInput``, ``BlockOutput`` and ``PIDs`` of the same files, and
no peak: under Podman the peak is the most sampled usage (:func:`parse_libpod_stats`).

Under runsc (gVisor) the counters are the sandbox's (the Sentry's threads and memory with the
job's), so pids there count the sandbox's threads, not the job's processes.

An engine is as untrusted as anything else the runner reads: each figure is a non-negative
integer of at most :data:`~runner.backends.types.ENGINE_COUNT_MAX` or it is not given (None),
and an answer that is not a JSON object, or whose ``read`` time is the zero time (the engine's
answer for a container that is not running: every counter 0), is no sample at all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runner.backends.types import ENGINE_COUNT_MAX, engine_count

__all__ = ["STATS_LINE_MAX", "StatsSample", "parse_libpod_stats", "parse_stats"]

STATS_LINE_MAX = 1024 * 1024
"""The most bytes of one stats answer read (a host of 1,000 CPUs lists each one's usage in
under 30 KiB); a longer one is no sample."""

_IO_ENTRIES_MAX = 4096
"""The most block-device entries summed from one answer."""


@dataclass(frozen=True)
class StatsSample:
    """The figures of one stats answer; None: the engine did not give that one."""

    cpu_ns: int | None = None
    cpu_user_ns: int | None = None
    cpu_system_ns: int | None = None
    memory_bytes: int | None = None
    memory_peak_bytes: int | None = None
    memory_limit_bytes: int | None = None
    io_read_bytes: int | None = None
    io_write_bytes: int | None = None
    pids: int | None = None
    pids_limit: int | None = None


def _obj(parent: object, key: str) -> dict[str, Any]:
    value = parent.get(key) if isinstance(parent, dict) else None
    return value if isinstance(value, dict) else {}


def _io(blkio: dict[str, Any]) -> tuple[int | None, int | None]:
    entries = blkio.get("io_service_bytes_recursive")
    if not isinstance(entries, list) or not entries:
        return None, None  # the block controller accounts nothing here (or cgroup v1 CFQ)
    read = write = 0
    seen_read = seen_write = False
    for entry in entries[:_IO_ENTRIES_MAX]:
        if not isinstance(entry, dict):
            continue
        op, value = entry.get("op"), engine_count(entry.get("value"))
        if not isinstance(op, str) or value is None:
            continue
        if op.lower() == "read":
            read, seen_read = min(read + value, ENGINE_COUNT_MAX), True
        elif op.lower() == "write":
            write, seen_write = min(write + value, ENGINE_COUNT_MAX), True
    return (read if seen_read else None), (write if seen_write else None)


def parse_stats(line: bytes | str | object) -> StatsSample | None:
    """The figures of one answer (its JSON text, or the decoded value); None when it is no
    sample (not JSON, not an object, too long, or the zero answer of a stopped container)."""
    raw = _decoded(line)
    if not isinstance(raw, dict):
        return None
    read = raw.get("read")
    if not isinstance(read, str) or read.startswith("0001-"):
        return None
    cpu = _obj(_obj(raw, "cpu_stats"), "cpu_usage")
    memory = _obj(raw, "memory_stats")
    pids = _obj(raw, "pids_stats")
    io_read, io_write = _io(_obj(raw, "blkio_stats"))
    return StatsSample(
        cpu_ns=engine_count(cpu.get("total_usage")),
        cpu_user_ns=engine_count(cpu.get("usage_in_usermode")),
        cpu_system_ns=engine_count(cpu.get("usage_in_kernelmode")),
        memory_bytes=engine_count(memory.get("usage")),
        memory_peak_bytes=engine_count(memory.get("max_usage")),
        memory_limit_bytes=engine_count(memory.get("limit")),
        io_read_bytes=io_read,
        io_write_bytes=io_write,
        pids=engine_count(pids.get("current")),
        pids_limit=engine_count(pids.get("limit")),
    )


def _decoded(line: bytes | str | object) -> object:
    if isinstance(line, bytes | str):
        if len(line) > STATS_LINE_MAX:
            return None
        try:
            return json.loads(line)
        except (ValueError, RecursionError):
            return None
    return line


def parse_libpod_stats(line: bytes | str | object) -> StatsSample | None:
    """The figures of one answer of Podman's own stats stream (``{"Error": ..., "Stats":
    [{...}]}``, the container's entry first); None when it is no sample (an error, no entry,
    or the zero entry of a container no longer running: ``UpTime`` and ``CPUNano`` 0)."""
    raw = _decoded(line)
    if not isinstance(raw, dict) or raw.get("Error") not in (None, ""):
        return None
    entries = raw.get("Stats")
    if not isinstance(entries, list) or not entries or not isinstance(entries[0], dict):
        return None
    e = entries[0]
    if not engine_count(e.get("UpTime")) and not engine_count(e.get("CPUNano")):
        return None
    return StatsSample(
        cpu_ns=engine_count(e.get("CPUNano")),
        cpu_system_ns=engine_count(e.get("CPUSystemNano")),
        memory_bytes=engine_count(e.get("MemUsage")),
        memory_limit_bytes=engine_count(e.get("MemLimit")) or None,
        io_read_bytes=engine_count(e.get("BlockInput")),
        io_write_bytes=engine_count(e.get("BlockOutput")),
        pids=engine_count(e.get("PIDs")),
    )
