"""The benchmark's targets (benchmarks/targets.py): a figure judged against its target, the
regression rule against the previous report, reading reports written before rows had ids,
and the performance table generated into docs/development/benchmarks.md."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from benchmarks import targets
from benchmarks._support import Row
from benchmarks.report import markdown
from benchmarks.targets import TARGETS, Target, X, change, compare, judge

ROOT = Path(__file__).resolve().parents[2]


def _row(key: str, ratio: float, unit: str = "s", **extra: Any) -> Row:
    stats = {"median": 1.0, "min": 1.0, "max": 1.0}
    return Row(f"label of {key}", key, unit, "base", stats, stats, ratio, extra=dict(extra))


def _figure(key: str | None, ratio: float, unit: str = "s", label: str = "") -> dict[str, Any]:
    f: dict[str, Any] = {"figure": label or f"label of {key}", "unit": unit, "ratio": ratio}
    if key is not None:
        f["key"] = key
    return f


def test_the_issue_targets_are_in_the_table() -> None:
    """Issue #29's table, figure by figure, and the earlier figures keep theirs."""
    want = {
        "toy": ("ratio", 1.5, True), "toyServed": ("ratio", 1.1, True),
        "startup-verify": ("seconds", 0.1, True), "concurrent": ("ratio", 0.8, False),
        "concurrentBatch": ("ratio", 0.9, False), "concurrentServed": ("ratio", 0.9, False),
        "slurm": ("ratio", 0.8, False), "parse": ("ratio", 1.5, True),
        "fetch": ("throughput", 0.9, False), "egressThroughput": ("ratio", 0.8, False),
        "startup-help": ("seconds", 0.25, True), "staging": ("ratio", 1.1, True),
    }  # fmt: skip
    for key, (on, bound, at_most) in want.items():
        t = TARGETS[key]
        assert (t.on, t.bound, t.at_most) == (on, bound, at_most), key


def test_a_ratio_target_is_met_up_to_its_bound_and_not_beyond() -> None:
    row = _row("toy", 1.5)
    judge(row)
    assert row.met and row.target == f"≤ 1.5{X}"
    row = _row("toy", 1.51)
    judge(row)
    assert not row.met
    low, high = _row("concurrentBatch", 0.89, "jobs/s"), _row("concurrentBatch", 0.9, "jobs/s")
    judge(low)
    judge(high)
    assert (low.met, high.met) == (False, True)


def test_a_throughput_target_on_a_timed_row_bounds_the_inverse_of_its_ratio() -> None:
    """fetch is timed: at least 0.9x the throughput is at most 1/0.9 the time."""
    t = TARGETS["fetch"]
    assert t.met(1.1, {"runnerPeakRssBytes": 50 * 10**6})
    assert not t.met(1.12, {"runnerPeakRssBytes": 50 * 10**6})
    assert not t.met(1.0, {"runnerPeakRssBytes": 101 * 10**6}), "RSS over its bound"
    assert not t.met(1.0, {}), "an RSS bound with no RSS measured is not met"


def test_a_seconds_target_bounds_the_difference_of_the_medians() -> None:
    t = TARGETS["startup-verify"]
    assert t.text() == "≤ +0.1 s over the baseline"
    assert t.met(19.0, {"differenceSeconds": 0.1})
    assert not t.met(1.1, {"differenceSeconds": 0.101})


def test_required_flags_must_be_true() -> None:
    t = Target("x", "seconds", 0.3, at_most=True, requires=("extractedOnce",))
    assert t.met(1.0, {"differenceSeconds": 0.0, "extractedOnce": True})
    assert not t.met(1.0, {"differenceSeconds": 0.0, "extractedOnce": False})
    assert not t.met(1.0, {"differenceSeconds": 0.0})


def test_a_row_without_a_target_keeps_its_own() -> None:
    row = _row("somethingNew", 5.0)
    row.target, row.met = "its own", True
    judge(row)
    assert (row.target, row.met) == ("its own", True)


def test_a_row_with_no_target_shows_a_dash_not_a_miss() -> None:
    """A figure shown for what it tells (an opt-in's, as toyAutoserve) is neither met nor
    missed in the table."""
    from benchmarks.report import table

    row = _row("toyAutoserve", 1.2)
    judge(row)
    assert row.target == ""
    [line] = [t for t in table([row]) if "toyAutoserve" in t]
    assert line.endswith("| — | — |  |  |") and "**no**" not in line


@pytest.mark.parametrize(
    ("unit", "previous", "ratio", "regressed"),
    [
        ("s", 1.0, 1.1, False),  # time up by exactly 10%
        ("s", 2.0, 2.2, False),  # the same, where 2.0 * 1.1 rounds above 2.2
        ("s", 0.3, 0.33, False),
        ("s", 1.0, 1.1001, True),  # time up by more
        ("s", 1.0, 0.5, False),  # time down: better
        ("jobs/s", 1.0, 0.9, False),  # throughput down by exactly 10%
        ("jobs/s", 0.5, 0.45, False),
        ("jobs/s", 1.0, 0.8999, True),  # throughput down by more
        ("MB/s", 1.0, 2.0, False),  # throughput up: better
        ("MB/s", 1.02, 0.8, True),
    ],
)
def test_the_regression_rule(unit: str, previous: float, ratio: float, regressed: bool) -> None:
    rel, bad = change(unit, previous, ratio)
    assert bad is regressed
    assert rel == pytest.approx(ratio / previous - 1)


def test_compare_matches_by_id_and_reads_old_reports_by_label() -> None:
    """Rows are matched by figure id, whatever their labels say (sizes differ by mode); a
    report whose rows have no id is matched by label; a figure new since is left alone."""
    old = {
        "figures": [
            _figure("parse", 2.0, label="parsing a 1 GiB evidence log"),
            _figure(None, 0.5, "jobs/s", label="label of concurrent"),  # no id: by label
            {"figure": "broken", "ratio": "n/a"},  # unreadable rows are skipped
        ]
    }
    new = [
        _figure("parse", 2.5, label="parsing a 256 MiB evidence log"),
        _figure("concurrent", 0.46, "jobs/s"),
        _figure("toy", 1.2),
    ]
    assert compare(new, old) == ["parse"]
    assert new[0]["previous"] == {"ratio": 2.0, "change": pytest.approx(0.25), "regressed": True}
    assert new[1]["previous"]["ratio"] == 0.5 and not new[1]["previous"]["regressed"]
    assert new[2]["previous"] is None
    assert compare([_figure("toy", 1.0)], None) == []


def test_the_previous_report_is_the_committed_one_else_the_file(tmp_path: Path) -> None:
    committed = subprocess.run(
        ["git", "-C", str(ROOT), "show", "HEAD:benchmarks/results/latest.json"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    report, source = targets.read_previous(targets.LATEST)
    assert report == json.loads(committed)
    assert source == "git HEAD:benchmarks/results/latest.json"
    elsewhere = tmp_path / "latest.json"
    assert targets.read_previous(elsewhere) == (None, "")
    elsewhere.write_text(json.dumps({"figures": []}))
    assert targets.read_previous(elsewhere) == ({"figures": []}, str(elsewhere))


def _report(figures: list[dict[str, Any]]) -> dict[str, Any]:
    machine = {
        "cpus": 2, "cpuModel": "cpu", "memoryBytes": 2**30, "kernel": "k", "os": "os",
        "dockerServerVersion": "1", "storageDriver": "overlay2", "cgroupVersion": "2",
        "python": "3.11", "runnerCommit": "abc1234", "runnerUncommitted": [],
        "loadAverageAtStart": [1.0, 1.0, 1.0],
    }  # fmt: skip
    return {
        "machine": machine, "command": "scripts/benchmark.py --quick", "mode": "quick",
        "startedAt": "2026-12-02T00:00:00Z", "durationSeconds": 1.0,
        "loadAverageAtEnd": [1.0, 1.0, 1.0], "errors": [], "figures": figures,
    }  # fmt: skip


def test_a_regression_heads_the_markdown_report() -> None:
    rows = [_row("toy", 1.4), _row("concurrentBatch", 0.95, "jobs/s")]
    for r in rows:
        judge(r)
    figures = [
        {"key": r.key, "figure": r.figure, "unit": r.unit, "ratio": r.ratio, "extra": {}}
        for r in rows
    ]
    report = _report(figures)
    report["previous"] = {"source": "git HEAD:x.json", "mode": "full", "startedAt": "then"}
    compare(figures, {"figures": [_figure("toy", 1.2), _figure("concurrentBatch", 0.96)]})
    text = markdown(report, rows)
    head, _, rest = text.partition("| figure |")
    assert "## Regressions" in head and f"(`toy`): 1.20{X} -> 1.40{X}, +17% (time up)" in head
    assert "concurrentBatch" not in head
    assert f"| 1.20{X} | +17% **regressed** |" in rest and f"| 0.96{X} | -1% |" in rest
    report.pop("previous")
    for f in figures:
        f["previous"] = None
    assert "Regressions" not in markdown(report, rows)


def test_the_perf_block_is_generated_from_the_report() -> None:
    report = _report(
        [
            {**_figure("startup-verify", 19.0), "extra": {"differenceSeconds": 0.3}},
            {**_figure("concurrentBatch", 0.95, "jobs/s"), "baselineName": "20 docker run"},
            {**_figure("toyAutoserve", 1.2), "baselineName": "docker run"},
        ]
    )
    page = "intro\n<!-- perf:begin -->\nold table\n<!-- perf:end -->\nafter\n"
    out = targets.with_perf_block(page, report)
    assert out.startswith("intro\n<!-- perf:begin -->\n") and out.endswith(
        "<!-- perf:end -->\nafter\n"
    )
    assert "old table" not in out
    assert f"| +0.300 s (19.00{X}) | ≤ +0.1 s over the baseline | **no** |" in out
    assert f"| 20 docker run | 0.95{X} | ≥ 0.9{X} | yes |" in out
    assert f"| `slurm` | | not in this report | ≥ 0.8{X} | |" in out, "targets with no figure"
    assert f"| `toyAutoserve` | docker run | 1.20{X} | — | — |" in out, "a figure with none"
    assert targets.with_perf_block(out, report) == out
    assert targets.with_perf_block("no markers\n", report) == "no markers\n"


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_docs"] = module
    spec.loader.exec_module(module)
    return module


def test_gen_docs_check_fails_on_a_stale_perf_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The committed page's block is the generated one; a report that changed makes it
    stale, and regenerating brings it back (into copies: the reference pages too)."""
    gen = _gen_docs()
    page, wanted = gen.perf_block()
    assert page == wanted, "docs/development/benchmarks.md: run `python scripts/gen_docs.py`"
    copy, report = tmp_path / "benchmarks.md", tmp_path / "latest.json"
    copy.write_text(page)
    report.write_text(targets.LATEST.read_text())
    monkeypatch.setattr(gen, "BENCHMARKS_PAGE", copy)
    monkeypatch.setattr(gen, "REFERENCE", tmp_path / "reference")
    monkeypatch.setattr(targets, "LATEST", report)
    assert gen.main([]) == 0 and copy.read_text() == page
    assert gen.main(["--check"]) == 0
    data = json.loads(report.read_text())
    data["figures"][0]["ratio"] += 1
    report.write_text(json.dumps(data))
    assert gen.main(["--check"]) == 1
    assert "stale performance table" in capsys.readouterr().out
    assert gen.main([]) == 0 and copy.read_text() != page
    assert gen.main(["--check"]) == 0
    copy.write_text("no block here\n")
    assert gen.main(["--check"]) == 1
