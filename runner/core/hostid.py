"""Which host this runner is on, as the ledger records it for each attempt.

A job's state folder may live on storage shared by several hosts (a Slurm cluster's nodes).
Each ``attempt.starting`` event names the host that started the attempt, so that a runner
which later finds the attempt unfinished knows whether this host's engine can tell what became
of its container (the same host) or not (another host: see ``runner.execution.attempt``, which then
waits
for the attempt's lease to run out and charges it by the rule the README states).

The host is its name (``gethostname``, what Slurm calls the node) and, as evidence, the
kernel's boot id (a reboot changes it; the engine's containers survive a reboot as exited).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["elsewhere", "identity", "name"]

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def name() -> str:
    """This host's name."""
    return socket.gethostname()


def identity() -> dict[str, str]:
    """This host as ``attempt.starting`` records it: ``{"name": ..., "bootId": ...}``."""
    try:
        boot = BOOT_ID.read_text(encoding="ascii").strip()[:64]
    except OSError:
        boot = ""
    return {"name": name(), "bootId": boot}


def elsewhere(starting: Mapping[str, Any]) -> str | None:
    """The other host's name when an ``attempt.starting`` event's data names a host that is
    not this one; None for this host, or an attempt recorded before hosts were (which only a
    runner of this host can have written: a state folder was never shared before)."""
    host = starting.get("host")
    if not isinstance(host, Mapping):
        return None
    recorded = host.get("name")
    return str(recorded) if isinstance(recorded, str) and recorded != name() else None
