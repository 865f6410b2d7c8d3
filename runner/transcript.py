"""The agent's transcript, read for its usage: turns and cost, while it runs and after.

An agent runtime prints its stream on stdout as JSON lines: Claude Code's
``--output-format stream-json --verbose`` (the scripted runtime speaks the same). The runner
captures stdout like any job's (a file under ``/job/output``, capped, kept per attempt, hashed
into the envelope) and reads it here:

- ``assistant`` events are the model's answers: each distinct ``message.id`` of the main
  thread (``parent_tool_use_id`` null) is one turn; every message's ``usage`` (the most seen
  per message, also from ``stream_event`` ``message_start``/``message_delta`` when the runtime
  streams partial messages) is priced with the adapter's prices, if it has any;
- the ``result`` event is the runtime's own account: ``num_turns``, ``total_cost_usd``, and a
  ``subtype`` of ``error_max_turns`` or ``error_max_budget_usd`` when it stopped itself at a
  limit.

Turns are the higher of the turns seen and the turns reported, cost the higher of the estimate
and the reported cost: usage may be over-counted, never under-counted. The file is in the
job's writable folder, so a job could rewrite it: what it shows is the runtime's report, not
proof (the model traffic through the egress proxy is the count the job cannot touch). Reads
are bounded: a line is at most 1 MiB (a longer one is skipped), each poll reads at most
:data:`POLL_BYTES`, and no link is followed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from runner import safefs

LINE_MAX = 1024 * 1024
POLL_BYTES = 8 * 1024 * 1024
"""At most this much of the transcript is read per poll (the rest at the next)."""
MAX_TOKENS = 10**15
"""A token count above this is not believed (and never overflows a float)."""
MAX_IDS = 100_000
"""Message ids remembered for de-duplication; past this, only consecutive repeats are."""

STOPPED = {"error_max_turns": "agent.maxTurns", "error_max_budget_usd": "agent.maxBudgetUsd"}
"""A runtime's result subtypes that say it stopped itself at a contract limit."""

_TOKENS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


@dataclass(frozen=True)
class Prices:
    """USD per million tokens: input, output, cache read, cache write."""

    input: float = 0.0
    output: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0

    def cost(self, tokens: list[int]) -> float:
        rates = (self.input, self.output, self.cache_read, self.cache_write)
        return sum(t * r for t, r in zip(tokens, rates, strict=True)) / 1e6


@dataclass(frozen=True)
class Usage:
    """What an attempt's transcript shows of its agent's usage."""

    turns: int = 0
    costUsd: float = 0.0
    reportedTurns: int | None = None
    reportedCostUsd: float | None = None
    stoppedFor: str | None = None
    """agent.maxTurns | agent.maxBudgetUsd when the runtime said it stopped at that limit."""
    tokens: dict[str, int] = field(default_factory=dict)

    def over(self, turns_left: float | None, budget_left: float | None) -> str | None:
        """The limit this usage is past (the runtime's own word first), or None."""
        if self.stoppedFor is not None:
            return self.stoppedFor
        if turns_left is not None and self.turns > turns_left:
            return "agent.maxTurns"
        if budget_left is not None and self.costUsd > budget_left:
            return "agent.maxBudgetUsd"
        return None


def _count(value: object) -> TypeGuard[int]:
    """A believable count: a JSON integer in [0, MAX_TOKENS]."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS


class Reader:
    """Folds transcript lines into a :class:`Usage`."""

    def __init__(self, prices: Prices | None = None) -> None:
        self.prices = prices or Prices()
        self._messages: dict[str, list[int]] = {}
        self._turn_ids: set[str] = set()
        self._turns_unremembered = 0
        self._last_id: str | None = None
        self._streaming: str | None = None
        self._reported_turns: int | None = None
        self._reported_cost: float | None = None
        self._stopped: str | None = None
        self._partial = b""
        self._skipping = False

    def restart(self) -> None:
        """The file is read again from its start (it was replaced or truncated)."""
        self._partial = b""
        self._skipping = False

    def feed(self, data: bytes) -> None:
        """Bytes of the transcript, in order; complete lines are read at once."""
        lines = data.split(b"\n")
        head = lines[0]
        if self._skipping:
            if len(lines) > 1:
                self._skipping = False
            lines[0] = b""
        else:
            lines[0] = self._partial + head
        self._partial = b""
        *complete, last = lines
        for raw in complete:
            if raw.strip():
                self.line(raw)
        if len(last) > LINE_MAX:
            self._skipping = True  # a line past the cap: skipped up to its end
        else:
            self._partial = last

    def line(self, raw: bytes) -> None:
        try:
            event = json.loads(raw)
        except (ValueError, RecursionError):
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "assistant":
            message = event.get("message")
            if isinstance(message, dict):
                main = event.get("parent_tool_use_id") is None
                self._message(message.get("id"), message.get("usage"), turn=main)
        elif kind == "stream_event":
            inner = event.get("event")
            if isinstance(inner, dict):
                main = event.get("parent_tool_use_id") is None
                if inner.get("type") == "message_start" and isinstance(inner.get("message"), dict):
                    msg = inner["message"]
                    self._streaming = msg.get("id") if isinstance(msg.get("id"), str) else None
                    self._message(self._streaming, msg.get("usage"), turn=main)
                elif inner.get("type") == "message_delta" and self._streaming is not None:
                    self._message(self._streaming, inner.get("usage"), turn=False)
        elif kind == "result":
            turns, cost = event.get("num_turns"), event.get("total_cost_usd")
            if _count(turns):
                self._reported_turns = max(self._reported_turns or 0, turns)
            if (
                isinstance(cost, int | float)
                and not isinstance(cost, bool)
                and 0 <= cost < 1e12
                and math.isfinite(cost)
            ):
                self._reported_cost = max(self._reported_cost or 0.0, float(cost))
            subtype = event.get("subtype")
            if isinstance(subtype, str) and subtype in STOPPED:
                self._stopped = STOPPED[subtype]

    def _message(self, mid: Any, usage: Any, *, turn: bool) -> None:
        if not isinstance(mid, str) or not mid:
            return
        if turn:
            if mid in self._turn_ids:
                pass
            elif len(self._turn_ids) < MAX_IDS:
                self._turn_ids.add(mid)
            elif mid != self._last_id:
                self._turns_unremembered += 1
            self._last_id = mid
        if not isinstance(usage, dict):
            return
        if mid not in self._messages and len(self._messages) >= MAX_IDS:
            return
        seen = self._messages.setdefault(mid, [0, 0, 0, 0])
        for i, key in enumerate(_TOKENS):
            value = usage.get(key)
            if _count(value) and value > seen[i]:
                seen[i] = value

    def usage(self) -> Usage:
        seen = len(self._turn_ids) + self._turns_unremembered
        totals = [sum(m[i] for m in self._messages.values()) for i in range(len(_TOKENS))]
        estimate = self.prices.cost(totals)
        reported = self._reported_cost
        return Usage(
            turns=max(seen, self._reported_turns or 0),
            costUsd=round(max(estimate, reported or 0.0), 6),
            reportedTurns=self._reported_turns,
            reportedCostUsd=reported,
            stoppedFor=self._stopped,
            tokens=dict(zip(("input", "output", "cacheRead", "cacheWrite"), totals, strict=True)),
        )


class Meter:
    """Tails one transcript file (``root/rel``, reached without following a link)."""

    def __init__(self, root: Path, rel: str, prices: Prices | None = None) -> None:
        self.root, self.rel = root, rel
        self.prices = prices
        self.reader = Reader(prices)
        self.offset = 0
        self._identity: tuple[int, int] | None = None

    def poll(self, budget: int = POLL_BYTES) -> Usage:
        """Read what was added since the last poll (at most ``budget`` bytes)."""
        with (
            contextlib.suppress(safefs.UnsafePath, OSError),
            safefs.open_under(self.root, self.rel) as f,
        ):
            st = os.fstat(f.fileno())
            if self._identity != (st.st_dev, st.st_ino) or st.st_size < self.offset:
                # Replaced or truncated: read it again (turns are de-duplicated by id).
                self._identity = (st.st_dev, st.st_ino)
                self.offset = 0
                self.reader.restart()
            f.seek(self.offset)
            left = budget
            while left > 0 and (chunk := f.read(min(1024 * 1024, left))):
                self.reader.feed(chunk)
                self.offset += len(chunk)
                left -= len(chunk)
        return self.reader.usage()

    def drain(self, cap: int = 1024 * 1024 * 1024) -> Usage:
        """Read to the end (at most ``cap`` bytes more): the attempt's final usage."""
        return self.poll(cap)


@dataclass
class AgentGuard:
    """The watch loop's guard on an agent's limits: what is left for this attempt."""

    meter: Meter
    turns_left: int | None
    budget_left: float | None

    def check(self) -> str | None:
        return self.meter.poll().over(self.turns_left, self.budget_left)

    def final(self) -> Usage:
        return self.meter.drain()
