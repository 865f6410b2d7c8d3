"""The egress proxy's log, read: each request the job made of the proxy, with its outcome.

The proxy (``images/proxy/egress-proxy``) writes one JSON object per line on its standard
output, which the engine keeps and the runner saves as the attempt's ``egress.log``: a
``request`` line when it has read a request head (method, target as asked), then one line with
its outcome under the same ``id``: ``refused`` (with why), ``connected`` or ``unreachable``
(allowed: it connected onward, or tried; ``connected`` names the address). Every line names
the ``lease`` (the attempt) it was served under. A request with no outcome line is
``incomplete``. A lease that logged its cap's worth has one ``tally`` line once it ended: its
whole counts (:func:`read_tally`).

:func:`read_log` only reads text: a line it does not know, a line of another lease, or a line
that is no JSON object is skipped. The proxy escapes what the job sent (JSON strings), so a
request cannot forge a line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runner.models.envelope import EgressConnection

__all__ = ["Tally", "read_log", "read_tally"]

TARGET_MAX = 600
"""The proxy logs at most this much of a target; the envelope keeps no more."""
_OUTCOMES = {"refused", "connected", "unreachable"}


def _text(data: dict[str, Any], key: str, cap: int) -> str:
    value = data.get(key)
    return value[:cap] if isinstance(value, str) else ""


def _object(raw: str) -> dict[str, Any] | None:
    """The JSON object of a log line; the engine's timestamp, when it kept one, comes first:
    ``<time> {json}``."""
    start = raw.find("{")
    if start < 0:
        return None
    try:
        data = json.loads(raw[start:])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _line(raw: str) -> dict[str, Any] | None:
    """A request's or outcome's line (it has an ``id``)."""
    data = _object(raw)
    return data if data is not None and isinstance(data.get("id"), int) else None


def read_log(text: str, lease: str | None = None) -> list[EgressConnection]:
    """The requests in the proxy's log (lines as the engine keeps them, with or without its
    timestamps), in the order they were read, each with its outcome; only those served under
    ``lease`` when it is given."""
    order: list[int] = []
    asked: dict[int, dict[str, Any]] = {}
    outcome: dict[int, dict[str, Any]] = {}
    # Lines end at "\n" only, as the engine splits them.
    for raw in text.split("\n"):
        data = _line(raw)
        if data is None or (lease is not None and data.get("lease") != lease):
            continue
        ident, event = data["id"], data.get("event")
        if event == "request" and ident not in asked:
            asked[ident] = data
            order.append(ident)
        elif event in _OUTCOMES and ident in asked and ident not in outcome:
            outcome[ident] = data
    found = []
    for ident in order:
        req, end = asked[ident], outcome.get(ident, {})
        host = _text(end, "host", 253) or None
        port = end.get("port")
        event = end.get("event")
        found.append(
            EgressConnection(
                at=_text(req, "at", 40) or None,
                method=_text(req, "method", 32),
                target=_text(req, "target", TARGET_MAX),
                host=host,
                port=port if isinstance(port, int) and 0 < port < 65536 else None,
                address=_text(end, "address", 45) or None,
                decision=(
                    "refused" if event == "refused" else "allowed" if event else "incomplete"
                ),
                detail=(
                    _text(end, "detail", 80) or "refused"
                    if event == "refused"
                    else str(event)
                    if event
                    else "no outcome"
                ),
            )
        )
    return found


@dataclass(frozen=True)
class Tally:
    """A capped lease's whole counts, as the proxy kept them past its log's cap."""

    requests: int
    refused: int
    connected: int
    unreachable: int

    @property
    def allowed(self) -> int:
        return self.connected + self.unreachable

    @property
    def incomplete(self) -> int:
        return max(self.requests - self.allowed - self.refused, 0)


def read_tally(text: str, lease: str) -> Tally | None:
    """The ``tally`` line of ``lease`` in the proxy's log; None when there is none (the lease
    never reached its cap, or the proxy ended before it saw the lease end)."""
    names = ("requests", "refused", "connected", "unreachable")
    for raw in text.split("\n"):
        if '"event":"tally"' not in raw:
            continue
        data = _object(raw)
        if data is None or data.get("event") != "tally" or data.get("lease") != lease:
            continue
        counts = [c for c in (data.get(k) for k in names) if type(c) is int and 0 <= c < 1 << 53]
        if len(counts) == len(names):
            return Tally(*counts)
    return None
