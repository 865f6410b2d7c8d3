"""The figures' targets, in one table keyed by figure id, and what is checked against them: a
row's target met or not, its change from the previous committed report (a regression is a
ratio more than 10% worse), and the performance table generated into
docs/development/benchmarks.md (``scripts/gen_docs.py``).

A figure id is a row's ``key`` (``toy``, ``startup-verify``, ``concurrentBatch``, ...), which
does not change with the sizes a mode measures; a report written before rows had keys is
matched by its rows' labels (``figure``) instead. Plain data and the standard library only:
the docs generator imports this without the benchmark's own dependencies.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

X = "\N{MULTIPLICATION SIGN}"
MB = 1000**2
REGRESSION = 0.10
"""A ratio more than this much worse (relative) than the previous report's is a regression."""
_EPSILON = 1e-9
"""Exactly 10% worse, give or take float rounding, is not a regression."""

ROOT = Path(__file__).resolve().parent.parent
LATEST = ROOT / "benchmarks" / "results" / "latest.json"


@dataclass(frozen=True)
class Target:
    """A bound on one figure: ``on`` the ratio (runner / baseline, time or throughput as the
    row's unit says), its inverse (the throughput ratio of a timed row), or the difference of
    the medians in seconds (``differenceSeconds`` of the row's extra); at most or at least
    ``bound``. ``rss_mb`` also bounds the runner's peak RSS, ``requires`` names extra flags
    that must be true. ``figure`` is the target table's wording of the figure, ``source``
    where the target was set."""

    figure: str
    on: Literal["ratio", "throughput", "seconds"]
    bound: float
    at_most: bool
    rss_mb: float | None = None
    requires: tuple[str, ...] = ()
    source: str = ""

    def text(self) -> str:
        sign = "≤" if self.at_most else "≥"
        if self.on == "seconds":
            out = f"{sign} +{self.bound:g} s over the baseline"
        elif self.on == "throughput":
            out = f"{sign} {self.bound:.3g}{X} the baseline's throughput"
        else:
            out = f"{sign} {self.bound:.3g}{X}"
        if self.rss_mb is not None:
            out += f"; RSS ≤ {self.rss_mb:g} MB"
        return out

    def value(self, ratio: float, extra: dict[str, Any]) -> float:
        """What the bound applies to, from a row's ratio and extra."""
        if self.on == "seconds":
            return float(extra["differenceSeconds"])
        if self.on == "throughput":
            return 1 / ratio if ratio > 0 else float("inf")
        return ratio

    def met(self, ratio: float, extra: dict[str, Any]) -> bool:
        v = self.value(ratio, extra)
        ok = v <= self.bound if self.at_most else v >= self.bound
        if self.rss_mb is not None:
            ok = ok and float(extra.get("runnerPeakRssBytes", float("inf"))) <= self.rss_mb * MB
        return ok and all(extra.get(flag) is True for flag in self.requires)


ISSUE = "issue #29"
EARLIER = "issue #8 and later"

TARGETS: dict[str, Target] = {
    # issue #29's table
    "toy": Target("toy `runner run`, fresh process vs `docker run` same caps",
                  "ratio", 1.5, at_most=True, source=ISSUE),
    "toyServed": Target("toy `runner run` with `runner serve` running vs the same",
                        "ratio", 1.1, at_most=True, source=ISSUE),
    "startup-verify": Target("`runner verify` start-up", "seconds", 0.1, at_most=True,
                             source=ISSUE),
    "concurrent": Target("20 jobs, 20 separate processes vs 20 `docker run`",
                         "ratio", 0.8, at_most=False, source=ISSUE),
    "concurrentBatch": Target("20 jobs, one batch", "ratio", 0.9, at_most=False, source=ISSUE),
    "concurrentServed": Target("20 jobs, 20 processes with `runner serve`",
                               "ratio", 0.9, at_most=False, source=ISSUE),
    "slurm": Target('10 jobs through Slurm, fresh process per job vs `sbatch --wrap "docker run"`',
                    "ratio", 0.8, at_most=False, source=ISSUE),
    "parse": Target("parse 1 GiB (`regex.scalar`) vs `grep -c`", "ratio", 1.5, at_most=True,
                    rss_mb=100, source=ISSUE),
    "fetch": Target("fetch an asset from loopback vs `curl -o` then `sha256sum`",
                    "throughput", 0.9, at_most=False, rss_mb=100, source=ISSUE),
    "egressThroughput": Target("100 MiB through the egress proxy vs direct",
                               "ratio", 0.8, at_most=False, source=ISSUE),
    # earlier figures, with their own targets
    "startup-help": Target("`runner --help` start-up", "seconds", 0.25, at_most=True,
                           source=EARLIER),
    "startup-verify-served": Target("`runner verify` start-up with `runner serve` running",
                                    "seconds", 0.25, at_most=True, source=EARLIER),
    "stdout": Target("stdout capture of a job writing 1 GiB", "ratio", 1 / 3, at_most=True,
                     rss_mb=100, source=EARLIER),
    "staging": Target("staging and hashing an input folder", "ratio", 1.1, at_most=True,
                      source=EARLIER),
    "stagecache": Target("staging a second job whose inputs and assets are cached",
                         "ratio", 0.05, at_most=True, source=EARLIER),
    "agentimage": Target("agent in the contract's image vs the adapter's", "seconds", 0.3,
                         at_most=True, requires=("extractedOnce",), source=EARLIER),
    "toySampling": Target("toy `runner run` with resource sampling vs without",
                          "ratio", 1.01, at_most=True, source="issue #31"),
    "egressOverhead": Target("egress allowlist: a small job's `runner run` wall time",
                             "seconds", 0.3, at_most=True, source=EARLIER),
}  # fmt: skip


def judge(row: Any) -> None:
    """Set a row's ``target`` and ``met`` from :data:`TARGETS` (a row whose key has no
    target keeps its own)."""
    t = TARGETS.get(row.key)
    if t is not None:
        row.target = t.text()
        row.met = t.met(row.ratio, row.extra)


def higher_is_better(unit: str) -> bool:
    """Throughput rows (jobs/s, MB/s): a larger ratio is better; time rows: a smaller one."""
    return unit.endswith("/s")


def change(unit: str, previous: float, ratio: float) -> tuple[float, bool]:
    """The relative change of a ratio from ``previous`` and whether it is a regression: more
    than 10% worse in the row's own direction (up for time, down for throughput)."""
    rel = ratio / previous - 1
    worse = -rel if higher_is_better(unit) else rel
    return rel, worse > REGRESSION + _EPSILON


def read_previous(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The committed report at ``path`` (``git show HEAD:<path>``), else the file on disk;
    and where it came from. ``(None, "")`` when neither is there or readable."""
    try:
        rel = path.resolve().relative_to(ROOT)
    except ValueError:
        rel = None
    if rel is not None:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"HEAD:{rel.as_posix()}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode == 0:
            try:
                return json.loads(out.stdout), f"git HEAD:{rel.as_posix()}"
            except json.JSONDecodeError:
                pass
    try:
        return json.loads(path.read_text()), str(rel or path)
    except (OSError, json.JSONDecodeError):
        return None, ""


def previous_rows(report: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A report's rows by figure id and, for rows without one (older reports), by label."""
    by_id: dict[str, Any] = {}
    by_label: dict[str, Any] = {}
    for f in (report or {}).get("figures", []):
        if not isinstance(f, dict) or not isinstance(f.get("ratio"), int | float):
            continue
        if f.get("key"):
            by_id[f["key"]] = f
        if f.get("figure"):
            by_label[f["figure"]] = f
    return by_id, by_label


def compare(figures: list[dict[str, Any]], previous: dict[str, Any] | None) -> list[str]:
    """Give each figure (a report's JSON row) its ``previous``: the earlier ratio, the change
    and whether it regressed, or None when the previous report lacks it. Returns the figure
    ids that regressed."""
    by_id, by_label = previous_rows(previous)
    regressed = []
    for f in figures:
        old = by_id.get(f["key"]) or by_label.get(f["figure"])
        if old is None or old["ratio"] <= 0 or f["ratio"] <= 0:
            f["previous"] = None
            continue
        rel, bad = change(f["unit"], float(old["ratio"]), f["ratio"])
        f["previous"] = {"ratio": old["ratio"], "change": rel, "regressed": bad}
        if bad:
            regressed.append(f["key"])
    return regressed


def regression_lines(figures: list[dict[str, Any]]) -> list[str]:
    """One line per regressed figure: its label, id, previous and new ratio, the change."""
    out = []
    for f in figures:
        p = f.get("previous")
        if p and p["regressed"]:
            way = "throughput down" if higher_is_better(f["unit"]) else "time up"
            out.append(
                f"{f['figure']} (`{f['key']}`): {p['ratio']:.2f}{X} -> {f['ratio']:.2f}{X}, "
                f"{p['change']:+.0%} ({way})"
            )
    return out


def _ratio_text(f: dict[str, Any], t: Target | None) -> str:
    out = f"{f['ratio']:.2f}{X}"
    if t is not None and t.on == "seconds" and "differenceSeconds" in f.get("extra", {}):
        out = f"{f['extra']['differenceSeconds']:+.3f} s ({out})"
    elif t is not None and t.on == "throughput" and f["ratio"] > 0:
        out += f" (throughput {1 / f['ratio']:.2f}{X})"
    rss = f.get("extra", {}).get("runnerPeakRssBytes")
    if t is not None and t.rss_mb is not None and rss is not None:
        out += f", RSS {rss / MB:.0f} MB"
    return out


def perf_markdown(report: dict[str, Any]) -> str:
    """The performance table of docs/development/benchmarks.md: every figure of ``report``
    judged against :data:`TARGETS` as they are now, then the targets it has no figure for."""
    m = report.get("machine", {})
    lines = [
        f"From `benchmarks/results/latest.json`: `{report.get('command', '?')}` "
        f"(mode {report.get('mode', '?')}), {report.get('startedAt', '?')}, at commit "
        f"{m.get('runnerCommit', '?')}, on {m.get('cpus', '?')} cores. Targets from "
        "`benchmarks/targets.py`, judged on the report's figures.",
        "",
        "| figure | id | baseline | ratio runner/baseline | target | met |",
        "|---|---|---|---|---|---|",
    ]
    seen = set()
    for f in report.get("figures", []):
        key = f.get("key", "")
        seen.add(key)
        t = TARGETS.get(key)
        if t is not None:
            target, met = t.text(), t.met(f["ratio"], f.get("extra", {}))
        else:
            target, met = f.get("target", ""), bool(f.get("met"))
        # A figure with no target (toyAutoserve, watch) is not met or unmet: a dash, as the
        # report's own table says it.
        verdict = ("yes" if met else "**no**") if target else "—"
        lines.append(
            f"| {f['figure']} | `{key}` | {f.get('baselineName', '')} | {_ratio_text(f, t)} | "
            f"{target or '—'} | {verdict} |"
        )
    for key, t in TARGETS.items():
        if key not in seen:
            lines.append(f"| {t.figure} | `{key}` | | not in this report | {t.text()} | |")
    return "\n".join(lines) + "\n"


def with_perf_block(text: str, report: dict[str, Any]) -> str:
    """``text`` with its ``<!-- perf:begin -->`` ... ``<!-- perf:end -->`` block brought up to
    date from ``report`` (unchanged when it has no such block)."""
    begin, end = "<!-- perf:begin -->", "<!-- perf:end -->"
    if begin not in text or end not in text:
        return text
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n{perf_markdown(report)}{end}{tail}"
