"""The agent's transcript, read for its usage: turns and cost, while it runs and after.

Long on purpose: the guard's whole account of an agent's usage (what is read, from where, how
it is counted, and when it fails closed) is one set of rules; split, each half would have to
restate the other's.

An agent runtime prints its stream on stdout as JSON lines: Claude Code's
``--output-format stream-json --verbose`` (the scripted runtime speaks the same). The runner
reads that stream where the job cannot touch it: the container's stdout as the engine hands it
to the runner (:class:`Capture`, a thread following the engine's log of the container), kept
as ``record/attempts/<n>/transcript.jsonl`` (never mounted into the container) and copied to
``/job/output/<stdoutPath>`` once the container has ended, for the job's evidence. The copy
in ``/job/output`` is never read for a budget decision.

- ``assistant`` events are the model's answers: each distinct ``message.id`` of the main
  thread (``parent_tool_use_id`` null) is one turn (a *model answer*); every message's
  ``usage`` (the most seen per message, also from ``stream_event``
  ``message_start``/``message_delta`` when the runtime streams partial messages) is priced
  with the adapter's prices, if it has any;
- the ``result`` event is the runtime's own account: ``num_turns``, ``total_cost_usd``, and a
  ``subtype`` of ``error_max_turns`` or ``error_max_budget_usd`` when it stopped itself at a
  limit. Its ``num_turns`` is kept as ``reportedTurns`` only (Claude Code counts one more
  than the model's answers when it stops at ``--max-turns``): turns are counted one way.

Turns are the model answers seen, floored by the model requests the egress proxy counted
(:class:`ProxyCount`: each request the proxy let through to the model's host is at least one
turn; over an HTTPS tunnel the proxy sees one request for the whole tunnel, so there it is a
floor of tunnels, not of requests); cost is the higher of the estimate and the reported cost:
usage may be over-counted, and what the runtime prints is never under-counted. A line that is
no JSON object (something wrote into the runtime's stream) fails the guard closed. Reads are
bounded: a line is at most :data:`LINE_MAX`, and one over 1 MiB at most :data:`MAX_VALUES` JSON
values (a line past either fails the guard closed too), each poll reads at most
:data:`POLL_BYTES`, no link is followed, and what is remembered of message ids is a 16-byte
digest each, at most :data:`MAX_IDS` of them, so the reader's memory is bounded whatever the
transcript holds. A transcript file the meter has read that vanishes, shrinks, becomes a link
or another file stops the agent (``agent.transcript``): the runner never guesses at usage it
can no longer read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from runner.backends.base import Backend, LogFollow
from runner.core import safefs

__all__ = [
    "CAPTURE",
    "LINE_MAX",
    "LONG_LINE",
    "MAX_IDS",
    "TAMPERED",
    "AgentGuard",
    "Capture",
    "Meter",
    "Prices",
    "ProxyCount",
    "Reader",
    "Usage",
]

LINE_MAX = 16 * 1024 * 1024
"""The longest line of an agent's stdout read; a longer one fails the guard closed."""
MAX_VALUES = 100_000
"""The most JSON values a line over :data:`LONG_LINE` may hold (each is a Python object when
parsed: 16 MiB of ``[],`` would be hundreds of MB); counted at C speed, strings blanked."""
LONG_LINE = 1024 * 1024
_STRING_BODY = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+')
_STRUCTURE = (b",", b":", b"[", b"{")
PROXY_LINE_MAX = 1024 * 1024
"""The longest line of the proxy's log read (the proxy writes short ones)."""
POLL_BYTES = 8 * 1024 * 1024
"""At most this much of the transcript is read per poll (the rest at the next)."""
MAX_TOKENS = 10**15
"""A token count above this is not believed (and never overflows a float)."""
MAX_IDS = 100_000
"""Message ids remembered (as digests) for de-duplication; past this, only consecutive
repeats are: some 100,000 x 16 bytes plus the set's own, a few MB at most."""
TAIL_CHECK = 4096
"""Bytes at the end of what a meter has read, checked unchanged at each poll."""
CAPTURE = "transcript.jsonl"
"""The runner's capture of the agent's stdout, in the attempt's record folder."""
STREAM_ENDED_GRACE = 5.0
"""Seconds the container may run on after the engine ended its stdout stream before the guard
stops it (the stream ends a moment before the container does when it exits by itself)."""

STOPPED = {"error_max_turns": "agent.maxTurns", "error_max_budget_usd": "agent.maxBudgetUsd"}
"""A runtime's result subtypes that say it stopped itself at a contract limit."""
TAMPERED = "agent.transcript"
"""The guard's reason when the agent's usage can no longer be read (fail closed)."""

_TOKENS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


def _digest(mid: str) -> bytes:
    return hashlib.blake2b(mid.encode("utf-8", "surrogatepass"), digest_size=16).digest()


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
    """What an attempt's transcript (and the egress proxy) show of its agent's usage."""

    turns: int = 0
    """Model answers seen, floored by ``requests``."""
    costUsd: float = 0.0
    reportedTurns: int | None = None
    reportedCostUsd: float | None = None
    stoppedFor: str | None = None
    """agent.maxTurns | agent.maxBudgetUsd when the runtime said it stopped at that limit."""
    tokens: dict[str, int] = field(default_factory=dict)
    answers: int = 0
    """Distinct model answers (main-thread assistant message ids) in the transcript."""
    requests: int | None = None
    """Requests the egress proxy let through to the model's hosts; None: no proxy counted."""
    tampered: str | None = None
    """Why the transcript can no longer be read (it vanished, shrank, was replaced, or the
    runner lost the engine's stream): the guard then stops the agent."""

    def over(self, turns_left: float | None, budget_left: float | None) -> str | None:
        """The limit this usage is past (the runtime's own word first), or None."""
        if self.tampered is not None:
            return TAMPERED
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


def _strings(raw: bytes) -> Iterator[tuple[int, int]]:
    """The spans of the JSON strings in ``raw``, left to right, each byte looked at once. A
    string left open ends the search: all after its quote is inside it. (A regular expression
    searched for them from every quote: 64 KB of ``\\"`` took 13 s, in the thread that
    meters the agent, with the interpreter's lock held.)"""
    find, body, size, pos = raw.find, _STRING_BODY.match, len(raw), 0
    while (start := find(b'"', pos)) >= 0:
        matched = body(raw, start + 1)  # always matches (it may be empty)
        end = matched.end() if matched else start + 1
        if end >= size or raw[end] != 0x22:  # no closing quote
            return
        yield start, end + 1
        pos = end + 1


def _values(raw: bytes) -> int:
    """At least the JSON values ``raw`` parses to, or a number past :data:`MAX_VALUES`: its
    strings, and the values that follow a ``,``, ``:`` or an opening bracket outside them;
    counted at C speed, in constant memory (at most :data:`MAX_VALUES` strings looked at)."""
    strings = inside = 0
    for start, end in _strings(raw):
        strings += 1
        if strings > MAX_VALUES:
            return strings
        inside += sum(raw.count(c, start, end) for c in _STRUCTURE)
    return max(strings, sum(raw.count(c) for c in _STRUCTURE) - inside + 1)


class Reader:
    """Folds transcript lines into a :class:`Usage`."""

    def __init__(self, prices: Prices | None = None) -> None:
        self.prices = prices or Prices()
        self._messages: dict[bytes, list[int]] = {}
        self._turn_ids: set[bytes] = set()
        self._turns_unremembered = 0
        self._last_id: bytes | None = None
        self._streaming: bytes | None = None
        self._reported_turns: int | None = None
        self._reported_cost: float | None = None
        self._stopped: str | None = None
        self._pieces: list[bytes] = []
        self._size = 0
        self._skipping = False
        self._lenient = False
        self.broken: str | None = None
        """Why the stream can no longer be believed: a line that is no JSON object (the
        runtime prints only those; the job can write into its stdout, through
        ``/proc/<pid>/fd/1``, and junk before a line hides that line's answer)."""

    def restart(self) -> None:
        """The next bytes start a new stream (another source of the same transcript), which
        may begin inside a line (the engine's log rotated): its first line is not judged."""
        self._pieces, self._size = [], 0
        self._skipping = False
        self._lenient = True

    def feed(self, data: bytes) -> None:
        """Bytes of the transcript, in order; complete lines are read at once. A line is
        kept in pieces (never copied while it grows) up to :data:`LINE_MAX`; past that it
        fails the stream closed (:attr:`broken`) and is skipped to its end."""
        *complete, last = data.split(b"\n")
        for piece in complete:
            self._hold(piece)
            self._end()
        self._hold(last)

    def _hold(self, piece: bytes) -> None:
        if self._skipping or not piece:
            return
        self._size += len(piece)
        if self._size <= LINE_MAX:
            self._pieces.append(piece)
            return
        self._pieces, self._skipping = [], True  # past the cap: skipped up to its end
        lenient, self._lenient = self._lenient, False
        if not lenient and self.broken is None:  # never quoted (it may hold a secret)
            self.broken = (
                f"a line of the agent's stdout is over {LINE_MAX // (1024 * 1024)} MiB: the "
                "runtime prints no such line, so something wrote into its stream, hiding "
                "what it printed"
            )

    def _end(self) -> None:
        pieces, self._pieces, self._size = self._pieces, [], 0
        if self._skipping:
            self._skipping = False
            return
        raw = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        del pieces
        if len(raw) > LONG_LINE and _values(raw) > MAX_VALUES:
            self._lenient = False
            if self.broken is None:
                self.broken = (
                    f"a line of the agent's stdout holds over {MAX_VALUES:,} JSON values: the "
                    "runtime prints no such line, so something wrote into its stream"
                )
            return
        if raw.strip():
            self.line(raw)

    def line(self, raw: bytes) -> None:
        lenient, self._lenient = self._lenient, False
        try:
            event = json.loads(raw)
        except (ValueError, RecursionError):
            event = None
        if not isinstance(event, dict):
            if not lenient and self.broken is None:
                # what the line holds is not quoted: it may be a secret, and this goes to
                # the ledger and the envelope
                self.broken = (
                    "a line of the agent's stdout is no JSON object: something wrote into the "
                    "runtime's stream, hiding what it printed"
                )
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
                    mid = msg.get("id")
                    self._streaming = _digest(mid) if isinstance(mid, str) and mid else None
                    self._message(mid, msg.get("usage"), turn=main)
                elif inner.get("type") == "message_delta" and self._streaming is not None:
                    self._usage(self._streaming, inner.get("usage"))
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
        key = _digest(mid)  # any length of id: 16 bytes kept
        if turn:
            if key in self._turn_ids:
                pass
            elif len(self._turn_ids) < MAX_IDS:
                self._turn_ids.add(key)
            elif key != self._last_id:
                self._turns_unremembered += 1
            self._last_id = key
        self._usage(key, usage)

    def _usage(self, key: bytes, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        if key not in self._messages and len(self._messages) >= MAX_IDS:
            return
        seen = self._messages.setdefault(key, [0, 0, 0, 0])
        for i, name in enumerate(_TOKENS):
            value = usage.get(name)
            if _count(value) and value > seen[i]:
                seen[i] = value

    def usage(self, requests: int | None = None, tampered: str | None = None) -> Usage:
        answers = len(self._turn_ids) + self._turns_unremembered
        totals = [sum(m[i] for m in self._messages.values()) for i in range(len(_TOKENS))]
        estimate = self.prices.cost(totals)
        reported = self._reported_cost
        return Usage(
            turns=max(answers, requests or 0),
            costUsd=round(max(estimate, reported or 0.0), 6),
            reportedTurns=self._reported_turns,
            reportedCostUsd=reported,
            stoppedFor=self._stopped,
            tokens=dict(zip(("input", "output", "cacheRead", "cacheWrite"), totals, strict=True)),
            answers=answers,
            requests=requests,
            tampered=tampered or self.broken,
        )


class Meter:
    """Tails one transcript file (``root/rel``, reached without following a link). Once read,
    the file must stay the same file and only grow: one that vanishes, shrinks, becomes a link
    or another file is *tampered* (what it held is kept; nothing more is read)."""

    def __init__(self, root: Path, rel: str, prices: Prices | None = None) -> None:
        self.root, self.rel = root, rel
        self.prices = prices
        self.reader = Reader(prices)
        self.offset = 0
        self.tampered: str | None = None
        self._identity: tuple[int, int] | None = None
        self._tail = b""
        """The last bytes read (up to :data:`TAIL_CHECK`): still there at each poll, or the
        file was rewritten (an inode number may be reused by a new file)."""

    def poll(self, budget: int = POLL_BYTES, requests: int | None = None) -> Usage:
        """Read what was added since the last poll (at most ``budget`` bytes)."""
        if self.tampered is None:
            self._read(budget)
        return self.reader.usage(requests, self.tampered)

    def _read(self, budget: int) -> None:
        where = f"{self.root.name}/{self.rel}"
        try:
            f = safefs.open_under(self.root, self.rel)
        except (safefs.UnsafePath, OSError) as exc:
            if self._identity is not None:  # it was there, and is gone or a link now
                self.tampered = f"{where} vanished or was replaced by a link ({exc})"
            return
        with f:
            st = os.fstat(f.fileno())
            if self._identity is None:
                self._identity = (st.st_dev, st.st_ino)
            elif self._identity != (st.st_dev, st.st_ino):
                self.tampered = f"{where} was replaced by another file"
                return
            if st.st_size < self.offset:
                self.tampered = f"{where} shrank from {self.offset} to {st.st_size} bytes"
                return
            if (
                self._tail
                and os.pread(f.fileno(), len(self._tail), self.offset - len(self._tail))
                != self._tail
            ):
                self.tampered = f"{where} was rewritten"
                return
            f.seek(self.offset)
            left = budget
            while left > 0 and (chunk := f.read(min(1024 * 1024, left))):
                self.reader.feed(chunk)
                self.offset += len(chunk)
                left -= len(chunk)
                self._tail = (self._tail + chunk)[-TAIL_CHECK:]

    def drain(self, cap: int = 1024 * 1024 * 1024, requests: int | None = None) -> Usage:
        """Read to the end (at most ``cap`` bytes more): the attempt's final usage."""
        return self.poll(cap, requests)


class _Follower:
    """A thread that follows one container's log in the engine (``follow_logs``), handing each
    chunk to ``sink``; it ends when the engine ends the stream or :meth:`stop` is called."""

    def __init__(
        self,
        backend: Backend,
        container: str,
        sink: Callable[[bytes], None],
        *,
        stdout: bool = True,
        since: float | None = None,
    ) -> None:
        self.handle = LogFollow()
        self.error: str | None = None
        self.ended_at: float | None = None
        self._args = (backend, container, sink, stdout, since)
        self._thread = threading.Thread(target=self._run, name="runner-follow", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        backend, container, sink, stdout, since = self._args
        try:
            backend.follow_logs(
                container, sink, stdout=stdout, stderr=not stdout, since=since, handle=self.handle
            )
        except Exception as exc:  # noqa: BLE001 - any failure: the stream is lost, and said so
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ended_at = time.monotonic()

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        self.handle.cancel()
        self._thread.join(5.0)


class Capture:
    """The runner's own capture of an agent's stdout: the engine's stream of the container,
    fed to a :class:`Reader` as it comes and kept (its first ``cap`` bytes) in ``path``, a file
    of the attempt's record that no container mounts. An earlier runner's capture of the same
    attempt (a reattach after a restart) is read first; the engine's stream is then read from
    its start again (answers are de-duplicated by id) and only what passes the earlier file's
    length is appended to it."""

    def __init__(self, path: Path, prices: Prices | None, cap: int) -> None:
        self.path, self.cap = path, cap
        self.reader = Reader(prices)
        self._lock = threading.Lock()
        self._follower: _Follower | None = None
        self._kept = 0
        self._skip = 0
        self._primed = False

    def prime(self) -> None:
        """Read what an earlier runner captured of this attempt (once)."""
        with self._lock:
            if self._primed:
                return
            self._primed = True
            with (
                contextlib.suppress(safefs.UnsafePath, OSError),
                safefs.open_under(self.path.parent, self.path.name) as f,
            ):
                while chunk := f.read(1024 * 1024):
                    self.reader.feed(chunk)
                    self._kept += len(chunk)
                self.reader.restart()
            self._skip = self._kept

    def attach(self, backend: Backend, container_id: str) -> None:
        """Follow the container's stdout in the engine from now on."""
        self.prime()
        if self._follower is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._follower = _Follower(backend, container_id, self._sink)

    def _sink(self, data: bytes) -> None:
        with self._lock:
            self.reader.feed(data)
            skip = min(self._skip, len(data))
            self._skip -= skip
            keep = data[skip : skip + max(self.cap - self._kept, 0)]
            if keep:
                fd = os.open(
                    self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600
                )
                try:
                    os.write(fd, keep)
                finally:
                    os.close(fd)
                self._kept += len(keep)

    def lost(self) -> str | None:
        """Why the stream can no longer be read while the container may still run, or None."""
        f = self._follower
        if f is None or f.ended_at is None:
            return None
        if f.error is not None:
            return f"the runner lost the engine's stream of the agent's stdout ({f.error})"
        if time.monotonic() - f.ended_at > STREAM_ENDED_GRACE:
            return "the engine ended the agent's stdout stream while its container ran on"
        return None

    def usage(self, requests: int | None = None, tampered: str | None = None) -> Usage:
        with self._lock:
            return self.reader.usage(requests, tampered)

    def final(self, timeout: float = 10.0) -> None:
        """The container has ended: wait for the rest of its stream (at most ``timeout``)."""
        self.prime()
        if self._follower is not None and not self._follower.join(timeout):
            self._follower.stop()

    def stop(self) -> None:
        if self._follower is not None:
            self._follower.stop()


class ProxyCount:
    """The model requests the egress proxy let through for one lease, counted live from the
    engine's log of the proxy (runner-side: the job cannot touch it). Each allowed connection
    to a model host (``host:port`` in ``hosts``) is at least one request, so at least one
    turn. The proxy writes one outcome line per request id, so a count is all it keeps."""

    def __init__(self, lease: str, hosts: set[str], proxy: str, since: float) -> None:
        self.lease, self.hosts, self.proxy, self.since = lease, hosts, proxy, since
        self._count = 0
        self._capped = False
        self._partial = b""
        self._lock = threading.Lock()
        self._follower: _Follower | None = None

    @property
    def count(self) -> int:
        with self._lock:
            return self._count

    def lost(self) -> str | None:
        """Why the proxy's count can no longer be read, or None: past its cap on a lease's
        log (``log-capped``) the proxy logs nothing more of it, so the requests that follow
        would go uncounted (a job can flood the log with refused requests to get there)."""
        with self._lock:
            capped = self._capped
        if not capped:
            return None
        return (
            "the egress proxy stopped logging this attempt's requests (its log of the lease "
            "reached its cap), so the model requests that follow cannot be counted"
        )

    def attach(self, backend: Backend) -> None:
        if self._follower is None:
            self._follower = _Follower(backend, self.proxy, self._sink, since=self.since)

    def _sink(self, data: bytes) -> None:
        with self._lock:
            *lines, self._partial = (self._partial + data).split(b"\n")
            if len(self._partial) > PROXY_LINE_MAX:
                self._partial = b""
            for raw in lines:
                self._line(raw)

    def _line(self, raw: bytes) -> None:
        needle = json.dumps(self.lease).encode()
        if needle not in raw or (b'"host"' not in raw and b'"log-capped"' not in raw):
            return
        start = raw.find(b"{")
        try:
            data = json.loads(raw[start:]) if start >= 0 else None
        except ValueError:
            return
        if (
            isinstance(data, dict)
            and data.get("lease") == self.lease
            and data.get("event") == "log-capped"
        ):
            self._capped = True
            return
        if (
            not isinstance(data, dict)
            or data.get("lease") != self.lease
            or data.get("event") not in ("connected", "unreachable")
            or not isinstance(data.get("id"), int)
            or f"{data.get('host')}:{data.get('port')}" not in self.hosts
        ):
            return
        self._count += 1

    def final(self, backend: Backend) -> int:
        """The count once the attempt has ended: the proxy's log read up to now."""
        if self._follower is not None:
            self._follower.stop()
        self._follower = None
        live = self.count
        with self._lock:
            capped, self._count, self._partial = self._capped, 0, b""
        try:  # counted again from the start of the lease, to its end
            backend.follow_logs(self.proxy, self._sink, since=self.since, follow=False)
        except Exception:  # noqa: BLE001 - the proxy's log is gone: what was counted live
            with self._lock:
                self._count = live
        with self._lock:
            self._capped |= capped
        with self._lock:
            self._count = max(self._count, live)
            return self._count

    def stop(self) -> None:
        if self._follower is not None:
            self._follower.stop()


@dataclass
class AgentGuard:
    """The watch loop's guard on an agent's limits: what is left for this attempt. Its usage
    is read from the runner's capture of the agent's stdout, floored by the proxy's count of
    model requests; never from a file the job can write."""

    capture: Capture
    turns_left: int | None
    budget_left: float | None
    proxy: ProxyCount | None = None
    _backend: Backend | None = None
    _final: Usage | None = None

    def attach(self, backend: Backend, container_id: str) -> None:
        """The container runs (or ran): follow its stdout and the proxy's log."""
        self._backend = backend
        self.capture.attach(backend, container_id)
        if self.proxy is not None:
            self.proxy.attach(backend)

    def _lost(self) -> str | None:
        """Why the usage can no longer be read: the capture's stream, or the proxy's count."""
        return self.capture.lost() or (self.proxy.lost() if self.proxy is not None else None)

    def usage(self) -> Usage:
        requests = self.proxy.count if self.proxy is not None else None
        return self.capture.usage(requests, self._lost())

    why: str | None = None
    """Why the guard failed closed (``agent.transcript``), once it has."""

    def check(self) -> str | None:
        self.capture.prime()
        usage = self.usage()
        over = usage.over(self.turns_left, self.budget_left)
        if over == TAMPERED:
            self.why = usage.tampered
        return over

    def close(self) -> None:
        """Stop following (the attempt ended without a final reading: an error)."""
        self.capture.stop()
        if self.proxy is not None:
            self.proxy.stop()

    def final(self) -> Usage:
        """The attempt's usage once its container has ended (computed once)."""
        if self._final is None:
            self.capture.final()
            requests = None  # never attached (it vanished): the proxy's kept log counts
            if self.proxy is not None and self._backend is not None:
                requests = self.proxy.final(self._backend)
            lost = self.proxy.lost() if self.proxy is not None else None
            self._final = self.capture.usage(requests, lost)
        return self._final
