"""The bound on a job's consumption that the README states (*The budget, restarts and
reattaching*), checked from what the ledger and the engine recorded, never from a fixed
wall-clock tolerance: a loaded machine makes every step slower, and the bound moves with what
was measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.execution import container
from runner.state.ledger import parse_time

COUNTING = 0.05
"""Milliseconds of rounding and of the gap between measuring a heartbeat's seconds and
stamping its time: all the under-count the bound allows."""


@dataclass(frozen=True)
class Checked:
    """What one attempt's bound was made of, for a test's message."""

    attempt: int
    how: str
    charged: float
    true_seconds: float
    found: float | None
    """What the last reattaching runner charged for the time no runner watched."""
    stop: dict[str, float] | None
    bound: float


def _events(job: Path) -> list[dict[str, Any]]:
    lines = (job / "record" / "ledger.jsonl").read_bytes().splitlines()
    return [json.loads(x) for x in lines if x]


def true_seconds(job: Path, n: int) -> float:
    """Attempt ``n``'s container's running time as the engine recorded it (StartedAt to
    FinishedAt, from the attempt's kept container-state.json)."""
    st = json.loads((job / "record" / "attempts" / str(n) / "container-state.json").read_text())
    started, finished = parse_time(st["StartedAt"]), parse_time(st["FinishedAt"])
    assert started is not None and finished is not None, st
    return (finished - started).total_seconds()


def check_bound(state: Path, limit: float, heartbeat: float) -> list[Checked]:
    """Assert, for every attempt of the one job under ``state``:

    - it is charged at least the container's true running time (the engine's StartedAt to
      FinishedAt): never under-counted;
    - stopped by a runner: the stop was asked for no later than one heartbeat after the
      budget's end, or after the moment a reattaching runner found the budget already spent
      (what it charged, its ``reattached`` heartbeat), and the attempt is charged no more than
      that plus the stop's own measured duration;
    - ended while no runner watched it: no later than the engine's own deadline
      (``engineDeadlineSeconds``), give or take its check's interval and the whole seconds
      it counts in.
    """
    (job,) = (state / "jobs").iterdir()
    events = _events(job)
    out: list[Checked] = []
    before = 0.0
    for start in (e for e in events if e["type"] == "attempt.starting"):
        n = start["data"]["attempt"]
        mine = [e for e in events if e["data"].get("attempt") == n]
        (fin,) = (e["data"] for e in mine if e["type"] == "attempt.finished")
        charged, left = float(fin["seconds"]), limit - before
        ran = true_seconds(job, n)
        assert charged >= ran - COUNTING, (n, charged, ran, fin)
        reattached = [
            e["data"]["attemptSeconds"]
            for e in mine
            if e["type"] == "heartbeat" and e["data"].get("reattached")
        ]
        found = reattached[-1] if reattached else None
        stop = fin.get("stop")
        if fin["classification"] == "timeout" and fin["how"] in {"observed", "reattached"}:
            assert stop is not None, ("a runner that stops a job records its stop", fin)
        if stop is not None:  # the runner stopped it
            due = max(left, found or 0.0)
            assert stop["atSeconds"] <= due + heartbeat, (n, stop, due, heartbeat, fin)
            bound = due + heartbeat + stop["seconds"]
            assert charged <= stop["atSeconds"] + stop["seconds"] + COUNTING, (n, stop, fin)
        elif fin["how"] == "recovered" and fin["classification"] == "timeout":
            interval = container.backstop(left, 0).interval_seconds
            bound = start["data"]["engineDeadlineSeconds"] + interval + 2
            assert ran <= bound, (n, ran, bound, fin)
        else:  # it ended by itself
            bound = max(left, charged)
        assert charged <= bound + COUNTING, (n, charged, bound, fin)
        out.append(Checked(n, fin["how"], charged, ran, found, stop, bound))
        before += charged
    assert out, "no attempt in the ledger"
    return out
