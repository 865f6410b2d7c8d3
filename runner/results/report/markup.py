"""What the report page is made of: its CSS, escaping and caps for the run's text, numbers
for people, tables, definition lists and SVG bars. Every string of the run reaches the page
through :func:`e` (cut to :data:`TEXT_CAP`, escaped with :func:`html.escape`, quotes too);
tables stop at :data:`ROWS_CAP` rows and count the rest."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence

__all__ = [
    "BIG",
    "CSS",
    "PALETTE",
    "ROWS_CAP",
    "TEXT_CAP",
    "bad",
    "e",
    "fl",
    "gauge",
    "nbytes",
    "num",
    "ok",
    "pairs",
    "section",
    "table",
]

TEXT_CAP = 2000
"""Characters of one string of the run shown, at most."""
BIG = 10**30
"""An integer this large or larger is shown by its size, not its digits."""
ROWS_CAP = 200
"""Rows of one table shown, at most (the rest are counted)."""

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;
background:#f6f7f9}
main{max-width:1100px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:0 0 10px}
section{background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:16px 20px;
margin:0 0 16px}
table{border-collapse:collapse;width:100%;margin:6px 0}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eceef2;vertical-align:top}
th{font-weight:600;color:#4a5365;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
code,pre{font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,monospace;font-size:12.5px}
pre{background:#f3f4f7;border-radius:6px;padding:8px 10px;overflow-x:auto;white-space:pre;
margin:6px 0}
mark{background:#ffe58a;padding:0 1px}
td code,dd code{word-break:break-all}
.verdict{display:inline-block;padding:3px 10px;border-radius:12px;font-weight:700;color:#fff}
.succeeded{background:#1f8a4c}.failed{background:#c0392b}.partial{background:#d68910}
.ok{color:#1f8a4c;font-weight:600}.bad{color:#c0392b;font-weight:600}.warn{color:#b9770e;font-weight:600}
.muted{color:#6b7385}.num{font-variant-numeric:tabular-nums}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin:6px 0}
dt{color:#4a5365}dd{margin:0;word-break:break-all}
svg text{font:11px system-ui,sans-serif;fill:#1d2330}
"""

PALETTE = ("#3b6fd4", "#e07b39", "#3aa776", "#a35bc9", "#c9495b", "#2f9fb3")


def ok(text: str) -> str:
    return f'<span class="ok">{e(text)}</span>'


def bad(text: str) -> str:
    return f'<span class="bad">{e(text)}</span>'


def e(value: object, cap: int = TEXT_CAP) -> str:
    """``value`` as text, cut to ``cap`` characters, escaped for HTML (quotes too)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= BIG:
        return num(value)
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    if len(text) > cap:
        text = text[:cap] + f"… ({len(text) - cap:,} more characters)"
    return html.escape(text, quote=True)


def num(value: object, digits: int = 6) -> str:
    """A number for people (``-`` when there is none)."""
    if isinstance(value, bool) or value is None:
        return e(value if value is not None else "-")
    if isinstance(value, int):
        if abs(value) >= BIG:  # never turned into digits: Python refuses past 4,300 of them
            size = value.bit_length() * math.log10(2)
            return f"{'-' if value < 0 else ''}(a number of about {size:,.0f} digits)"
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if math.isfinite(value) else e(value)
    return e(value)


def fl(value: object) -> float:
    """``value`` as a float for arithmetic: an integer too large for one is infinite, what is
    not a number is 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    if isinstance(value, int) and abs(value) >= BIG:
        return math.inf if value > 0 else -math.inf
    return float(value)


def nbytes(value: object) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return "-"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A table; ``rows`` hold HTML already escaped (by :func:`e` or :func:`num`)."""
    body: list[str] = []
    left = 0
    for i, row in enumerate(rows):
        if i >= ROWS_CAP:
            left += 1
            continue
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
    more = (
        f'<tr><td colspan="{len(headers)}" class="muted">… {left:,} more rows not shown</td></tr>'
        if left
        else ""
    )
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}{more}</tbody></table>"


def pairs(items: Iterable[tuple[str, str]]) -> str:
    """A definition list; values are HTML already escaped."""
    return "<dl>" + "".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{e(title)}</h2>{body}</section>'


def gauge(label: str, used: float, limit: float | None, shown: str) -> str:
    """An SVG bar of ``used`` against ``limit`` (a plain bar when there is no limit)."""
    width, height = 520, 18
    frac = min(1.0, used / limit) if limit and limit > 0 and math.isfinite(limit) else 0.0
    frac = frac if math.isfinite(frac) else 1.0
    colour = "#c0392b" if limit and used >= limit else "#3b6fd4"
    bar = f'<rect x="0" y="0" width="{width * frac:.1f}" height="{height}" fill="{colour}"/>'
    title = f"{label}: {shown}"
    return (
        f'<svg role="img" aria-label="{e(title)}" width="{width + 4}" height="{height + 4}" '
        f'viewBox="-2 -2 {width + 4} {height + 4}"><title>{e(title)}</title>'
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#eceef2" rx="3"/>{bar}</svg>'
    )
