"""The report page: one self-contained HTML file, rendered section by section from plain data.

Each section is a function of :class:`~runner.results.report.gather.ReportData` returning its
HTML, or None to leave it out; :data:`SECTIONS` lists them in page order, so a later section
(the resource curves, a replay's summary) is one more function in the list. The page loads
nothing: inline CSS, inline SVG, no script, and a Content-Security-Policy that forbids every
fetch (``default-src 'none'``), so a browser opening it from disk reaches no network.

Everything shown comes from a run, which is hostile: each string is cut to a cap and escaped
(:func:`~runner.results.report.markup.e`) where it is put in the page, numbers are formatted
here, and no text of the run ever becomes markup, an attribute name, a URL or a style.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from runner.results.report.excerpt import Excerpt
from runner.results.report.gather import SERIES_POINTS_CAP, ReportData
from runner.results.report.markup import (
    CSS,
    PALETTE,
    ROWS_CAP,
    e,
    fl,
    gauge,
    nbytes,
    num,
    pairs,
    section,
    table,
)

__all__ = ["SECTIONS", "Section", "render", "replay_section", "resources_section"]

Section = Callable[[ReportData], "str | None"]


# -- the sections ------------------------------------------------------------------------------


def verdict_section(data: ReportData) -> str:
    env = data.envelope
    status = str(env.get("status"))
    cls = status if status in ("succeeded", "failed", "partial") else "failed"
    failure = env.get("failure")
    rows = [
        ("job", e(env.get("jobId"))),
        ("contract", e(env.get("contractName"))),
        ("contract digest", f"<code>{e(env.get('contractDigest'))}</code>"),
        ("exit code", num(env.get("exitCode"))),
        ("runner", e(env.get("runnerVersion"))),
        ("started", e(env["timings"].get("startedAt"))),
        ("finished", e(env["timings"].get("finishedAt"))),
        ("ran", f"{num(env['timings'].get('runSeconds'), 4)} s"),
        ("revision", num(env.get("revision"))),
        ("from", f"{e(data.kind)} <code>{e(data.source)}</code>"),
    ]
    head = f'<span class="verdict {cls}" id="verdict">{e(status)}</span>'
    if failure:
        head += (
            f' <span class="bad" id="failure-category">{e(failure["category"])}</span>'
            f' <span class="muted">at {e(failure["stage"])}</span>'
            f'<p id="failure-reason">{e(failure["reason"])}</p>'
        )
    warnings = "".join(f"<li>{e(w)}</li>" for w in env.get("warnings", [])[:ROWS_CAP])
    more = f"<h3>Warnings</h3><ul>{warnings}</ul>" if warnings else ""
    return section("summary", "Verdict", f"<p>{head}</p>{pairs(rows)}{more}")


def _excerpt(ex: Excerpt | None) -> str:
    if ex is None:
        return ""
    lines = []
    for i, line in enumerate(ex.lines):
        if i == ex.hit and ex.span is not None:
            a, b = ex.span
            lines.append(f"{e(line[:a])}<mark>{e(line[a:b])}</mark>{e(line[b:])}")
        else:
            lines.append(e(line))
    where = f" (line {ex.line_number:,})" if ex.line_number else ""
    note = f'<div class="warn">{e(ex.problem)}</div>' if ex.problem else ""
    pre = f"<pre>{chr(10).join(lines)}</pre>" if lines else ""
    return f'<div class="excerpt"><span class="muted">evidence{e(where)}</span>{note}{pre}</div>'


def measurements_section(data: ReportData) -> str:
    env = data.envelope
    blocks: list[str] = []
    for m in env.get("measurements", [])[:ROWS_CAP]:
        parser = f"{m['parser']['id']}@{m['parser']['version']}"
        ev = m["evidence"]
        rows = [
            ("value", f'<b class="num measurement-value">{num(m["value"], 12)}</b> {e(m["unit"])}'),
            ("metric", e(m["metric"])),
            ("parser", f"<code>{e(parser)}</code>"),
            ("evidence", f"<code>output/{e(ev['path'])}</code> ({nbytes(ev.get('size'))})"),
            ("sha256", f"<code>{e(ev.get('sha256'))}</code>"),
        ]
        blocks.append(
            f'<div class="measurement" id="m-{len(blocks)}"><h3>{e(m["measurementId"])}</h3>'
            f"{pairs(rows)}{_excerpt(data.excerpts.get(m['measurementId']))}</div>"
        )
    left = len(env.get("measurements", [])) - ROWS_CAP
    if left > 0:
        blocks.append(f'<p class="muted">… {left:,} more measurements not shown</p>')
    errors = env.get("measurementErrors", [])
    if errors:
        blocks.append(
            "<h3>Not read</h3>"
            + table(
                ["measurement", "category", "reason"],
                ([e(x["measurementId"]), e(x["category"]), e(x["reason"])] for x in errors),
            )
        )
    if not blocks:
        blocks.append('<p class="muted">No measurement was read.</p>')
    return section("measurements", "Measurements", "".join(blocks))


def attempts_section(data: ReportData) -> str:
    env = data.envelope
    budget = env.get("budget") or {}
    limit = budget.get("limitSeconds") or (env.get("limits") or {}).get("timeoutSeconds")
    spent = sum(fl(a["seconds"]) for a in data.attempts)
    scale = max(fl(limit), spent, 1e-9)
    width, height = 720, 30
    rects, x = [], 0.0
    for i, a in enumerate(data.attempts[:ROWS_CAP]):
        w = width * fl(a["seconds"]) / scale if math.isfinite(scale) else 0.0
        title = f"attempt {num(a['attempt'])}: {num(a['seconds'], 4)} s, {a['classification']}"
        rects.append(
            f'<rect class="attempt" x="{x:.2f}" y="0" width="{max(w, 1):.2f}" height="{height}" '
            f'fill="{PALETTE[i % len(PALETTE)]}"><title>{e(title)}</title></rect>'
        )
        x += w
    caption = (
        f"{num(spent, 4)} s used of a {num(limit, 4)} s budget"
        if limit
        else f"{num(spent, 4)} s used"
    )
    svg = (
        f'<svg role="img" aria-label="{e(caption)}" width="{width}" height="{height + 18}" '
        f'viewBox="0 0 {width} {height + 18}"><title>{e(caption)}</title>'
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#eceef2"/>{"".join(rects)}'
        f'<text x="0" y="{height + 14}">0 s</text>'
        f'<text x="{width}" y="{height + 14}" text-anchor="end">{e(num(scale, 4))} s</text></svg>'
    )
    rows = (
        [
            num(a["attempt"]),
            e(a["startedAt"] or "-"),
            f'<span class="num">{num(a["seconds"], 4)} s</span>',
            e(a["classification"] or "in flight"),
            e(a["how"] or ""),
            e(a["host"] or ""),
        ]
        for a in data.attempts
    )
    body = (
        f"<p>{e(caption)}</p>{svg}"
        + table(["attempt", "started", "seconds", "ended", "how", "host"], rows)
        if data.attempts
        else '<p class="muted">No attempt ran.</p>'
    )
    return section("attempts", "Attempts against the budget", body)


def _series_svg(name: str, samples: list[tuple[float, float]], cap: float | None) -> str:
    width, height = 720, 120
    xs = [t for t, _ in samples]
    top = max([v for _, v in samples] + ([cap] if cap else []) + [1e-9])
    x0, x1 = min(xs), max(max(xs), min(xs) + 1e-9)
    points = " ".join(
        f"{width * (t - x0) / (x1 - x0):.1f},{height - height * v / top:.1f}" for t, v in samples
    )
    cap_y = height - height * cap / top if cap else 0.0
    cap_line = (
        f'<line x1="0" x2="{width}" y1="{cap_y:.1f}" y2="{cap_y:.1f}" stroke="#c0392b" '
        f'stroke-dasharray="4 3"/><text x="{width}" y="{max(cap_y, 12):.1f}" '
        f'text-anchor="end">cap {e(num(cap))}</text>'
        if cap
        else ""
    )
    return (
        f'<svg role="img" aria-label="{e(name)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}"><title>{e(name)}</title>'
        f'<rect width="{width}" height="{height}" fill="#f3f4f7"/>{cap_line}'
        f'<polyline points="{points}" fill="none" stroke="#3b6fd4" stroke-width="1.5"/></svg>'
    )


def resources_section(data: ReportData) -> str | None:
    """Per-attempt resource figures and their curves against the caps, when the envelope has
    them (:func:`~runner.results.report.gather.resources_of`); left out otherwise. Each
    figure is a row; a ``series`` (samples with a time ``t`` and numeric figures) is drawn one
    curve a figure, against ``caps[figure]`` when the record names one."""
    if not data.resources:
        return None
    parts = []
    for res in data.resources[:ROWS_CAP]:
        given = res.get("caps")
        caps: Mapping[str, object] = given if isinstance(given, Mapping) else {}
        scalars = [
            (str(k), num(v))
            for k, v in res.items()
            if k not in ("attempt", "series", "caps") and isinstance(v, int | float)
        ]
        parts.append(f"<h3>attempt {num(res.get('attempt'))}</h3>{pairs(scalars)}")
        series = res.get("series")
        if isinstance(series, list):
            samples = [s for s in series[:SERIES_POINTS_CAP] if isinstance(s, Mapping)]
            keys = sorted({k for s in samples for k in s if k != "t"})[:12]
            for k in keys:
                pts = [
                    (fl(s["t"]), fl(s[k]))
                    for s in samples
                    if isinstance(s.get("t"), int | float) and isinstance(s.get(k), int | float)
                ]
                c = caps.get(k)
                pts = [(x, y) for x, y in pts if math.isfinite(x) and math.isfinite(y)]
                cap = fl(c) if isinstance(c, int | float) and math.isfinite(fl(c)) else None
                if len(pts) >= 2:
                    parts.append(f"<div>{e(k)}</div>{_series_svg(k, pts, cap)}")
    return section("resources", "Resources against their caps", "".join(parts))


def agent_section(data: ReportData) -> str | None:
    env = data.envelope
    agent, usage = env.get("agent"), env.get("agentUsage")
    if agent is None and usage is None:
        return None
    parts = []
    if agent:
        parts.append(
            pairs(
                [
                    ("runtime", e(agent.get("runtime"))),
                    ("image", f"<code>{e(agent.get('image'))}</code>"),
                    ("commands ran in", e(agent.get("runIn"))),
                    ("prompt", f"{e(agent.get('prompt'))} ({e(agent.get('promptSource'))})"),
                    ("transcript", f"<code>output/{e(agent.get('transcript'))}</code>"),
                ]
            )
        )
    if usage:
        turns, max_turns = usage.get("turns", 0), usage.get("maxTurns")
        cost, max_cost = usage.get("costUsd", 0.0), usage.get("maxBudgetUsd")
        shown_turns = f"{num(turns)} of {num(max_turns) if max_turns is not None else 'no limit'}"
        shown_cost = f"${cost:.4f} of " + (
            f"${max_cost:.2f}" if max_cost is not None else "no limit"
        )
        parts.append(
            f'<p>turns <b id="agent-turns">{e(shown_turns)}</b></p>'
            + gauge(
                "turns", fl(turns), fl(max_turns) if max_turns is not None else None, shown_turns
            )
            + f'<p>cost <b id="agent-cost">{e(shown_cost)}</b></p>'
            + gauge("cost", fl(cost), max_cost, shown_cost)
        )
        rows = (
            [
                num(a["attempt"]),
                num(a["turns"]),
                f"${a['costUsd']:.4f}",
                num(a.get("requests")),
                e(a.get("stoppedFor") or ""),
            ]
            for a in usage.get("attempts", [])
        )
        parts.append(table(["attempt", "turns", "cost", "requests", "stopped for"], rows))
    result = env.get("agentResult")
    if result:
        flags = "; ".join(f"{f['code']}: {f['message']}" for f in result.get("flags", []))
        valid = (
            '<span class="ok">valid</span>'
            if result["valid"]
            else '<span class="bad">not valid</span>'
        )
        parts.append(pairs([("its result.json", valid), ("flags", e(flags or "none"))]))
    return section("agent", "The agent's turns and cost against its limits", "".join(parts))


def egress_section(data: ReportData) -> str | None:
    eg = data.envelope.get("egress")
    if eg is None:
        return None
    rows = (
        [e(c.get("at") or ""), e(c["method"]), e(c["target"]), e(c["decision"]), e(c["detail"])]
        for c in eg.get("connections", [])
    )
    problems = "".join(f"<li>{e(p)}</li>" for p in eg.get("problems", [])[:ROWS_CAP])
    body = (
        pairs(
            [
                ("allowed hosts", e(", ".join(eg.get("allow", [])))),
                (
                    "connections",
                    f"{num(eg['allowed'])} allowed, {num(eg['refused'])} refused, "
                    f"{num(eg['incomplete'])} incomplete",
                ),
                ("log", f"<code>{e(eg.get('log'))}</code>"),
            ]
        )
        + table(["at", "method", "target", "decision", "detail"], rows)
        + (f"<ul>{problems}</ul>" if problems else "")
    )
    return section("egress", "Egress", body)


def inputs_section(data: ReportData) -> str:
    env = data.envelope
    rows: list[list[str]] = []
    image = env.get("image")
    if image:
        rows.append(["image", e(image.get("reference")), f"<code>{e(image.get('id'))}</code>"])
        if image.get("repoDigest"):
            rows.append(["image (registry)", "", f"<code>{e(image['repoDigest'])}</code>"])
    runtime = (env.get("agent") or {}).get("agentRuntime")
    if runtime:
        rows.append(["agent runtime image", "", f"<code>{e(runtime['image'].get('id'))}</code>"])
    for i in env.get("inputs", []):
        rows.append([e(i["field"]), e(i["path"]), f"<code>{e(i['digest'])}</code>"])
    for m in env.get("materials", []):
        digest = ", ".join(f"{k}:{v}" for k, v in m.get("digest", {}).items())
        rows.append(["material", e(m["name"]), f"<code>{e(digest)}</code>"])
    body = (
        table(["what", "name", "digest"], rows) if rows else '<p class="muted">None recorded.</p>'
    )
    return section("inputs", "Inputs and images by digest", body)


def signatures_section(data: ReportData) -> str:
    env = data.envelope
    v = data.verification
    sig = env.get("signature") or {}
    if sig.get("status") == "verified":
        contract = '<span class="ok">verified</span> at run by ' + e(", ".join(sig["keyIds"]))
    elif sig:
        contract = '<span class="warn">unsigned</span> (accepted by the host for local development)'
    else:
        contract = '<span class="muted">not recorded</span>'
    mark = (
        '<span class="ok">verifies</span>'
        if v.valid
        else '<span class="bad">does not verify</span>'
    )
    rows = [
        ("contract signature", contract),
        ("result", f'<span id="signatures-verdict">{mark}</span>: {e(v.summary)}'),
        ("checked by", f"<code>{e(v.how)}</code>"),
    ]
    if v.signed_by:
        rows.append(("result signed by", e(", ".join(v.signed_by))))
    checks = ""
    if v.checks:
        status = {"ok": "ok", "failed": "bad", "unverified": "warn"}
        checks = table(
            ["check", "status", "detail"],
            (
                [
                    e(c.name),
                    f'<span class="{status.get(c.status, "muted")}">{e(c.status)}</span>',
                    e(c.detail),
                ]
                for c in v.checks
            ),
        )
    return section("signatures", "Signatures", pairs(rows) + checks)


def _value(v: Mapping[str, object]) -> str:
    if v.get("value") is None:
        return f'<span class="muted">{e(v.get("missing") or "not read")}</span>'
    return num(v["value"]) if isinstance(v["value"], int | float) else e(v["value"])


def _same(identical: object) -> str:
    return (
        '<span class="ok">identical</span>'
        if identical is True
        else ('<span class="bad">differs</span>')
    )


def replay_section(data: ReportData) -> str | None:
    """The job's replays (``runner replay``, its ``record/replays.json``): the verdict and what
    differed first, each run, each measurement's values and spread, each evidence file's
    hashes; left out when the job has none."""
    replay = data.replay
    if not isinstance(replay, Mapping):
        return None
    if "problem" in replay:
        return section("replay", "Reproducibility (replays)", f"<p>{e(replay['problem'])}</p>")
    runs = [r for r in replay.get("runs") or [] if isinstance(r, Mapping)]
    head = [
        ("verdict", _same(replay.get("identical"))),
        ("summary", e(replay.get("summary"))),
        ("replays", f"{num(replay.get('times'))} asked, "
         + ("all run" if replay.get("complete") else "not all run (interrupted)")),
        ("began", e(replay.get("startedAt"))),
    ]  # fmt: skip
    first = replay.get("firstDifference")
    if isinstance(first, Mapping):
        head.append(("first difference", f'<span class="bad">{e(first.get("detail"))}</span>'))
    run_rows = (
        [
            num(r.get("run")),
            e(r.get("jobId")),
            e(r.get("status")),
            '<span class="bad">failed</span>' if r.get("failed") else "",
            e(r.get("problem") or ""),
        ]
        for r in runs[:ROWS_CAP]
    )
    m_rows = []
    for m in (replay.get("measurements") or [])[:ROWS_CAP]:
        if not isinstance(m, Mapping):
            continue
        values = [v for v in m.get("values") or [] if isinstance(v, Mapping)]
        spread = ""
        if m.get("range") is not None:
            spread = f"range {num(m.get('range'))}"
            if m.get("relativeSpread") is not None:
                spread += f", {num(fl(m.get('relativeSpread')) * 100, 3)} %"
        m_rows.append([
            e(m.get("measurementId")),
            ", ".join(_value(v) for v in values[:ROWS_CAP]),
            _same(m.get("identical")),
            spread,
            num(m.get("firstDifferentRun")) if m.get("firstDifferentRun") is not None else "",
        ])  # fmt: skip
    ev_rows = []
    for ev in (replay.get("evidence") or [])[:ROWS_CAP]:
        if not isinstance(ev, Mapping):
            continue
        hashes = [h for h in ev.get("hashes") or [] if isinstance(h, Mapping)]
        shown = ", ".join(
            f"<code>{e(str(h.get('sha256') or '-')[:12])}</code>" for h in hashes[:ROWS_CAP]
        )
        ev_rows.append([e(ev.get("path")), shown, _same(ev.get("identical"))])
    body = (
        pairs(head)
        + "<h3>Runs</h3>"
        + table(["run", "job", "status", "", "problem"], run_rows)
        + "<h3>Measurements</h3>"
        + table(["measurement", "values (run 0 first)", "", "spread", "first differs in"], m_rows)
        + "<h3>Evidence files</h3>"
        + table(["file", "sha256 (run 0 first)", ""], ev_rows)
    )
    return section("replay", "Reproducibility (replays)", body)


SECTIONS: list[Section] = [
    verdict_section,
    measurements_section,
    attempts_section,
    resources_section,
    agent_section,
    egress_section,
    inputs_section,
    signatures_section,
    replay_section,
]
"""The sections in page order; each returns its HTML, or None to be left out."""


def render(data: ReportData, sections: Sequence[Section] = SECTIONS) -> str:
    """The whole page."""
    body = "".join(part for part in (s(data) for s in sections) if part)
    title = f"runner report: {data.envelope.get('jobId')} ({data.envelope.get('status')})"
    csp = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{e(title, 300)}</title><style>{CSS}</style></head>"
        f"<body><main><h1>{e(title, 300)}</h1>{body}"
        '<p class="muted">Written by <code>runner report</code>; this page loads nothing.</p>'
        "</main></body></html>\n"
    )
