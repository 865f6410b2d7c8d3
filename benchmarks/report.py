"""The report: the figures' table, notes and profiles as markdown, and the rows as JSON."""

from __future__ import annotations

import json
from typing import Any

from benchmarks._support import (
    GIB,
    MIB,
    Row,
    X,
    spread,
)
from benchmarks.targets import REGRESSION, regression_lines


def table(rows: list[Row], previous: list[dict[str, Any] | None] | None = None) -> list[str]:
    """The figures' table; with ``previous`` (per row, as targets.compare gives them), the
    previous report's ratio and the change from it."""
    prev = previous if previous is not None else [None] * len(rows)
    out = [
        "| figure | baseline | runner | ratio runner/baseline | target | met | previous | change |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r, p in zip(rows, prev, strict=True):
        ratio = f"{r.ratio:.2f}{X}"
        if r.paired:
            ratio += f" [{r.paired['min']:.2f} to {r.paired['max']:.2f}]"
        if "differenceSeconds" in r.extra:
            ratio += f", {r.extra['differenceSeconds']:+.3f} s"
        if "speedup" in r.extra:
            ratio += f" ({r.extra['speedup']:.2f}{X} faster)"
        if "runnerPeakRssBytes" in r.extra and r.key != "staging":
            ratio += f", RSS {r.extra['runnerPeakRssBytes'] / MIB:.0f} MB"
        if p is None:
            before, delta = "", ""
        else:
            before = f"{p['ratio']:.2f}{X}"
            delta = f"{p['change']:+.0%}" + (" **regressed**" if p["regressed"] else "")
        out.append(
            f"| {r.figure} | {spread(r.baseline, r.unit)} | {spread(r.runner, r.unit)} | "
            f"{ratio} | {r.target or '—'} | {_met(r)} | {before} | {delta} |"
        )
    return out


def markdown(report: dict[str, Any], rows: list[Row]) -> str:
    m = report["machine"]
    figures = report.get("figures", [])
    lines = ["# Runner benchmark", ""]
    regressed = regression_lines(figures)
    if regressed:
        lines += [
            "## Regressions",
            "",
            f"More than {REGRESSION:.0%} worse than the previous report ({previous_text(report)}):",
            "",
            *(f"- {line}" for line in regressed),
            "",
        ]
    lines += [
        f"`{report['command']}`, {report['startedAt']}, took {report['durationSeconds']:.0f} s "
        f"(mode: {report['mode']}).",
        "",
        f"Machine: {m['cpus']} cores ({m['cpuModel']}), {m['memoryBytes'] / GIB:.1f} GiB memory, "
        f"kernel {m['kernel']}, {m['os']}; Docker {m['dockerServerVersion']} "
        f"({m['storageDriver']}, cgroup v{m['cgroupVersion']}); Python {m['python']}; "
        f"runner {m['runnerCommit']} ({len(m['runnerUncommitted'])} uncommitted files under "
        f"runner/). Load average at start {m['loadAverageAtStart'][0]:.2f}, "
        f"at end {report['loadAverageAtEnd'][0]:.2f}; memory cgroups at start "
        f"{m.get('memoryCgroupsAtStart', 'not recorded')} (the dying ones of removed containers "
        "included: hundreds slow the engine); the engine is shared with other users.",
        "",
        "Medians with [min to max] over the interleaved repeats; the ratio is runner / baseline "
        "of the medians (throughput for the concurrent jobs, time otherwise), with the range of "
        "the per-pair ratios. Targets: benchmarks/targets.py. Previous and change: the ratio in "
        f"the previous report ({previous_text(report)}) and the relative change from it; more "
        f"than {REGRESSION:.0%} worse (time ratio up, throughput ratio down) is a regression.",
        "",
        *table(rows, [f.get("previous") for f in figures] if len(figures) == len(rows) else None),
        "",
    ]
    for e in report["errors"]:
        lines.append(f"- **{e['figure']} failed**: {e['error']}")
    lines += ["## Notes", ""]
    for r in rows:
        for n in r.notes:
            lines.append(f"- {r.figure}: {n}")
    box = report.get("boxCheck")
    if box:
        lines.append(
            "- same box: `docker inspect` of a runner-started container and of the baseline's "
            + ("agree on " + ", ".join(box["runner"]) if box["same"] else
               f"DIFFER: {json.dumps(box['differences'])}")
        )  # fmt: skip
    imp = report.get("importProfile")
    if imp:
        lines += [
            "",
            "## Where `runner --help` spends its start-up",
            "",
            f"`python -X importtime -m runner --help`: {imp['modules']} modules, "
            f"{imp['totalImportSeconds']:.3f} s of imports in all (importtime inflates them "
            "somewhat):",
            "",
            *import_lines(imp, 10, with_self=True),
        ]
    prof = report.get("runProfile")
    if prof:
        imp = prof["imports"]
        lines += [
            "",
            "## Where one toy `runner run` spends its time",
            "",
            f"`{prof['command']}` under pyinstrument (wall clock, 1 ms samples; library "
            "frames folded):",
            "",
            "```",
            *prof["pyinstrument"],
            "```",
            "",
            f"Its imports (`-X importtime`): {imp['modules']} modules, "
            f"{imp['totalImportSeconds']:.3f} s in all (inflated by importtime):",
            "",
            *import_lines(imp, 12, with_self=False),
        ]
    return "\n".join(lines) + "\n"


def previous_text(report: dict[str, Any]) -> str:
    """Which report the figures were compared with, in words."""
    p = report.get("previous")
    if not p:
        return "none: smoke mode compares with none" if report.get("mode") == "smoke" else "none"
    return f"{p['source']}, {p.get('mode', '?')} mode, {p.get('startedAt', '?')}"


def import_lines(imp: dict[str, Any], top: int, *, with_self: bool) -> list[str]:
    """An import profile as markdown bullets: by package, (by module,) imported by runner.*."""

    def ms(items: list[dict[str, Any]], name: str, key: str) -> str:
        return ", ".join(f"{x[name]} {x[key] * 1000:.0f} ms" for x in items[:top])

    lines = ["- by package (own time, summed): " + ms(imp["byPackage"], "package", "selfSeconds")]
    if with_self:
        lines.append("- modules by own time: " + ms(imp["bySelf"], "module", "selfSeconds"))
    lines.append(
        "- third-party imports made by `runner.*` (cumulative): "
        + ms(imp["importedByRunner"], "module", "cumulativeSeconds")
    )
    return lines


def row_json(r: Row) -> dict[str, Any]:
    return {
        "key": r.key,
        "figure": r.figure,
        "unit": r.unit,
        "baselineName": r.baseline_name,
        "baseline": r.baseline,
        "runner": r.runner,
        "ratio": r.ratio,
        "pairedRatio": r.paired,
        "target": r.target,
        "met": r.met,
        "extra": r.extra,
        "notes": r.notes,
    }


def _met(row: Row) -> str:
    """The met column: yes, **no**, or a dash for a row that has no target (a figure shown
    for what it tells, as an opt-in's)."""
    if not row.target:
        return "—"
    return "yes" if row.met else "**no**"
