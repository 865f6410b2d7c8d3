"""`runner report`'s page of real runs (the toy evaluation succeeded, a job that failed, the
scripted agent's run, and a signed run's bundle), opened from disk in a real browser: Debian's
chromium driven by Playwright (launched by path; `playwright install` is never run). The page
must load with no console message of level error and no page error, fetch nothing but itself,
and show the run's figures.

The tests of the page's data and of hostile runs, with no engine, are tests/unit/test_report.py.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import missing
from tests.integration.test_agent_runs import _policy
from tests.integration.test_bundle import _export, _keys, _signed_run
from tests.support import run_cli, run_job, session_containers, write_contract
from tests.support.agents import EXAMPLE, agent_contract

pytestmark = pytest.mark.docker


@dataclass
class Opened:
    """What the browser saw of a page."""

    texts: dict[str, str]
    """Element id -> its text, for the ids the page gives its figures."""
    body: str
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("Playwright is not installed: run scripts/setup.sh (requirements/dev.lock)")
    chromium = shutil.which("chromium")
    if chromium is None:
        missing("Debian's chromium is not installed: run scripts/setup.sh")
    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=chromium)
        try:
            yield launched
        finally:
            launched.close()


def _open(browser: Any, page_file: Path) -> Opened:
    page = browser.new_page()
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda r: requests.append(r.url))
    url = page_file.absolute().as_uri()
    page.goto(url, wait_until="load")
    ids = page.eval_on_selector_all("[id]", "els => els.map(e => [e.id, e.innerText])")
    opened = Opened({k: v for k, v in ids}, page.inner_text("body"), errors)
    opened.requests = [r for r in requests if r != url]
    page.close()
    return opened


def _report(target: Path, out: Path, *extra: str) -> dict[str, Any]:
    proc = run_cli("report", str(target), "-o", str(out), "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    info: dict[str, Any] = json.loads(proc.stdout)
    assert info["report"] == str(out)
    return info


def _shown(opened: Opened) -> None:
    assert opened.errors == [], opened.errors
    assert opened.requests == [], opened.requests


def _values(opened: Opened) -> list[str]:
    return [v for k, v in opened.texts.items() if k.startswith("m-")]


def test_the_page_of_the_toy_evaluation_shows_its_accuracy(
    tmp_path: Path, image_id: str, browser: Any
) -> None:
    code, env, err = run_job(write_contract(tmp_path, image_id), tmp_path / "state")
    assert code == 0, err
    info = _report(Path(env["jobDir"]), tmp_path / "toy.html")
    assert info["verified"] is True and info["status"] == "succeeded"
    opened = _open(browser, tmp_path / "toy.html")
    _shown(opened)
    assert opened.texts["verdict"] == "succeeded"
    (measurement,) = _values(opened)
    assert "0.819" in measurement and "json.scalar@1" in measurement
    assert "logs/evaluation.log" in measurement
    assert "verifies" in opened.texts["signatures-verdict"]
    assert env["image"]["id"] in opened.body
    assert f"{env['budget']['limitSeconds']:g} s budget" in opened.texts["attempts"]
    assert not session_containers()


def test_the_page_of_a_failed_run_shows_its_category(
    tmp_path: Path, image_id: str, browser: Any
) -> None:
    job = "import sys; print('checkpoint missing', file=sys.stderr); sys.exit(3)"
    contract = write_contract(tmp_path, image_id, command=["python3", "-c", job])
    code, env, _ = run_job(contract, tmp_path / "state")
    assert code == 1 and env["failure"]["category"] == "nonzero_exit"
    state = tmp_path / "state"
    info = _report(Path(env["jobId"]), tmp_path / "failed.html", "--state-dir", str(state))
    assert info["status"] == "failed"
    opened = _open(browser, tmp_path / "failed.html")
    _shown(opened)
    assert opened.texts["verdict"] == "failed"
    assert opened.texts["failure-category"] == "nonzero_exit"
    assert "checkpoint missing" in opened.texts["failure-reason"]


def test_the_page_of_an_agent_run_shows_its_turns_and_cost(
    tmp_path: Path, scripted_agent_image: str, browser: Any
) -> None:
    prompt = (EXAMPLE / "prompt.scripted.md").read_text()
    contract = agent_contract(tmp_path, prompt=prompt, agent={"maxTurns": 40, "maxBudgetUsd": 3})
    code, env, err = run_job(contract, tmp_path / "state", *_policy(tmp_path, scripted_agent_image))
    assert code == 0, (env["failure"], err)
    _report(Path(env["jobDir"]), tmp_path / "agent.html")
    opened = _open(browser, tmp_path / "agent.html")
    _shown(opened)
    usage = env["agentUsage"]
    assert opened.texts["agent-turns"] == f"{usage['turns']} of 40"
    assert opened.texts["agent-cost"] == f"${usage['costUsd']:.4f} of $3.00"
    (measurement,) = _values(opened)
    assert "0.819" in measurement
    assert scripted_agent_image in opened.body


def test_the_page_of_a_bundle_shows_the_run_and_its_checks(
    tmp_path: Path, image_id: str, browser: Any
) -> None:
    signed = _signed_run(tmp_path, write_contract(tmp_path, image_id))
    archive = tmp_path / "run.tar.gz"
    _export(signed.job, archive, signed=signed)
    shutil.rmtree(signed.job)  # the page is of the bundle alone
    info = _report(archive, tmp_path / "bundle.html", *_keys(signed))
    assert info["from"] == "bundle" and info["verified"] is True
    opened = _open(browser, tmp_path / "bundle.html")
    _shown(opened)
    (measurement,) = _values(opened)
    assert "0.819" in measurement
    checks = opened.texts["signatures"]
    assert "runner verify bundle" in checks and "seal" in checks and "measurements" in checks
    assert "verifies" in opened.texts["signatures-verdict"]


def test_the_browser_check_sees_errors_and_fetches(tmp_path: Path, browser: Any) -> None:
    """The checks above can fail: a page that logs an error, throws and fetches is seen to."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><body><img src="http://127.0.0.1:9/x.png">'
        '<script>console.error("logged"); throw new Error("thrown")</script></body></html>'
    )
    opened = _open(browser, bad)
    assert any("logged" in x for x in opened.errors)
    assert any("thrown" in x for x in opened.errors)
    assert opened.requests == ["http://127.0.0.1:9/x.png"]


@pytest.mark.hostile
def test_a_hostile_runs_page_runs_nothing_in_the_browser(tmp_path: Path, browser: Any) -> None:
    """The unit suite's hostile page (markup, `</script>`, event handlers in every string the
    run controls), opened for real: nothing runs, nothing is fetched, the text is shown."""
    from runner.results import report
    from tests.unit.test_report import HOSTILE, hostile_data

    page_file = report.write(hostile_data(tmp_path), tmp_path / "hostile.html")
    opened = _open(browser, page_file)
    _shown(opened)
    assert HOSTILE in opened.body


def test_the_page_of_a_replayed_job_shows_what_differed_first(
    tmp_path: Path, image_id: str, browser: Any
) -> None:
    """`runner replay` of a job that reads /dev/urandom: the original's page shows its replays
    (record/replays.json), the measurements identical, the noisy file not, named first."""
    from tests.integration.test_replay import NOISY
    from tests.support import SESSION_ID, SESSION_LABEL, json_measurement

    contract = write_contract(
        tmp_path,
        image_id,
        command=["python3", "-c", NOISY],
        measurements=[
            json_measurement("logs/stable.json", mid="stable"),
            json_measurement("logs/noisy.json", mid="noisy"),
        ],
    )
    code, env, err = run_job(contract, tmp_path / "state")
    assert code == 0, err
    job = Path(env["jobDir"])
    replayed = run_cli("replay", str(job), "--times", "1", "--allow-unsigned",
                       "--label", f"{SESSION_LABEL}={SESSION_ID}")  # fmt: skip
    assert replayed.returncode == 1, replayed.stderr  # it differs
    _report(job, tmp_path / "replayed.html")
    opened = _open(browser, tmp_path / "replayed.html")
    _shown(opened)
    section = opened.texts["replay"]
    assert "differs" in section and "logs/noisy.json" in section
    assert f"{job.name}-replay-1" in section
    assert section.count("identical") >= 2  # the two measurements' values
    assert not session_containers()


def test_the_page_of_a_job_that_uses_memory_draws_its_curves_against_the_cap(
    tmp_path: Path, image_id: str, browser: Any
) -> None:
    """A job that holds 64 MiB for three seconds: the engine's stats are sampled (#31), and its
    page shows the attempt's figures and draws the memory curve under the cap from the
    attempt's record/attempts/1/resources.json."""
    hold = (
        "import time; b = bytearray(64 << 20); b[::4096] = b'x' * (len(b) // 4096); time.sleep(3)"
    )
    code, env, err = run_job(
        write_contract(tmp_path, image_id, command=["python3", "-c", hold]), tmp_path / "state"
    )
    assert code in (0, 1), err  # no evidence: missing_evidence, which is beside the point
    (attempt,) = env["attempts"]
    assert attempt["resources"]["samples"] >= 2, attempt["resources"]
    _report(Path(env["jobDir"]), tmp_path / "memory.html")
    opened = _open(browser, tmp_path / "memory.html")
    _shown(opened)
    section = opened.texts["resources"]
    assert "memoryPeakBytes" in section and "memoryBytes" in section
    page = (tmp_path / "memory.html").read_text()
    assert page.count("<polyline") >= 2  # a curve a figure, from the series
