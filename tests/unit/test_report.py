"""`runner report`: the page of a run, from a job folder (made by the fake backend here) or
from a constructed envelope; hostile evidence and envelopes. The page opened in a real
browser, of real runs and their bundles, is tests/integration/test_report_browser.py."""

from __future__ import annotations

import html.parser
import json
import os
from pathlib import Path
from typing import Any

import pytest

from runner.backends.fake import FakeBackend, FakeJob
from runner.results import report
from runner.results.report import page
from runner.results.report.excerpt import EXCERPT_CAP, LINE_CAP, READ_CAP, excerpt
from runner.results.report.gather import Check, ReportData, Verification
from tests.support import run_cli
from tests.unit.test_orchestrator_fake import _contract, _image, _options, _run
from tests.unit.test_orchestrator_fake import fake as fake

# -- a page of constructed data ----------------------------------------------------------------


def _envelope(**changes: Any) -> dict[str, Any]:
    env: dict[str, Any] = {
        "jobId": "toy-1",
        "contractName": "toy",
        "contractDigest": "sha256:" + "c" * 64,
        "runnerVersion": "0.0.0",
        "status": "succeeded",
        "failure": None,
        "exitCode": 0,
        "image": {"reference": "runner-cpu:local", "id": "sha256:" + "a" * 64, "repoDigest": None},
        "measurements": [
            {
                "measurementId": "toy-accuracy",
                "metric": "accuracy",
                "unit": "fraction",
                "value": 0.819,
                "parser": {"id": "json.scalar", "version": "1"},
                "evidence": {
                    "path": "logs/evaluation.log",
                    "sha256": "sha256:" + "e" * 64,
                    "size": 20,
                },
            }
        ],
        "measurementErrors": [],
        "timings": {
            "startedAt": "2026-01-01T00:00:00Z",
            "finishedAt": "2026-01-01T00:00:09Z",
            "totalSeconds": 9.0,
            "runSeconds": 7.5,
        },
        "budget": {
            "limitSeconds": 60.0,
            "consumedSeconds": 7.5,
            "remainingSeconds": 52.5,
            "attempts": 1,
        },
        "signature": {"status": "verified", "keyIds": ["issuer-key-1"]},
        "inputs": [{"field": "$.paper.path", "path": "paper.md", "digest": "sha256:" + "d" * 64}],
        "materials": [],
        "warnings": [],
        "revision": 1,
    }
    env.update(changes)
    return env


def _data(env: dict[str, Any], **changes: Any) -> ReportData:
    fields: dict[str, Any] = {
        "source": "/jobs/toy-1",
        "kind": "job",
        "envelope": env,
        "excerpts": {},
        "verification": Verification("runner verify result", True, "the signed result verifies"),
        "attempts": [
            {
                "attempt": 1,
                "seconds": 7.5,
                "classification": "completed",
                "how": None,
                "host": "h",
                "startedAt": "2026-01-01T00:00:01+00:00",
            }
        ],
    }
    fields.update(changes)
    return ReportData(**fields)


class _Tags(html.parser.HTMLParser):
    """Every start tag, attribute and the text of a page, as a browser's parser reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(text: str) -> _Tags:
    tags = _Tags()
    tags.feed(text)
    return tags


ALLOWED_TAGS = {
    "html",
    "head",
    "meta",
    "title",
    "style",
    "body",
    "main",
    "h1",
    "h2",
    "h3",
    "section",
    "p",
    "span",
    "b",
    "code",
    "pre",
    "mark",
    "dl",
    "dt",
    "dd",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "div",
    "ul",
    "li",
    "svg",
    "rect",
    "text",
    "line",
    "polyline",
}


def test_a_page_of_a_succeeded_run_shows_its_figures_and_loads_nothing() -> None:
    text = page.render(_data(_envelope()))
    tags = _parse(text)
    assert {t for t, _ in tags.tags} <= ALLOWED_TAGS
    assert not [a for _, attrs in tags.tags for a in attrs if a in ("src", "href")]
    (csp,) = [
        a["content"] for t, a in tags.tags if a.get("http-equiv") == "Content-Security-Policy"
    ]
    assert csp is not None and csp.startswith("default-src 'none'")
    words = " ".join(tags.text)
    for shown in (
        "succeeded",
        "0.819",
        "json.scalar@1",
        "output/logs/evaluation.log",
        "7.5 s used of a 60 s budget",
        "issuer-key-1",
        "sha256:" + "d" * 64,
    ):
        assert shown in words, shown
    assert "Agent" not in words and "Egress" not in words  # sections of what did not happen


def test_a_failed_run_shows_its_category_and_reason() -> None:
    env = _envelope(
        status="failed",
        failure={
            "category": "nonzero_exit",
            "stage": "container",
            "retryable": False,
            "reason": "the job exited 3",
        },
        measurements=[],
        measurementErrors=[
            {"measurementId": "m", "category": "missing_evidence", "reason": "no file"}
        ],
    )
    words = " ".join(_parse(page.render(_data(env))).text)
    assert "nonzero_exit" in words and "the job exited 3" in words
    assert "missing_evidence" in words


def test_an_agent_run_shows_its_turns_and_cost_against_its_limits() -> None:
    usage = {
        "source": "claude-code",
        "maxTurns": 40,
        "maxBudgetUsd": 3.0,
        "turns": 7,
        "costUsd": 0.25,
        "attempts": [{"attempt": 1, "turns": 7, "costUsd": 0.25}],
    }
    text = page.render(_data(_envelope(agentUsage=usage)))
    words = " ".join(_parse(text).text)
    assert "7 of 40" in words and "$0.2500 of $3.00" in words


def test_resources_and_replay_are_rendered_only_when_given() -> None:
    plain = page.render(_data(_envelope()))
    assert 'id="resources"' not in plain and 'id="replay"' not in plain
    res = {
        "attempt": 1,
        "cpuSeconds": 3.5,
        "caps": {"memoryBytes": 100},
        "series": [{"t": 0, "memoryBytes": 10}, {"t": 1, "memoryBytes": 60}],
    }
    replay = {
        "times": 2,
        "complete": True,
        "identical": False,
        "summary": "differs",
        "runs": [{"run": 0, "jobId": "j", "status": "succeeded", "failed": False}],
        "measurements": [
            {
                "measurementId": "toy-accuracy",
                "values": [{"run": 0, "value": 0.819}, {"run": 1, "value": 0.82}],
                "identical": False,
                "range": 0.001,
                "relativeSpread": 0.0012,
                "firstDifferentRun": 1,
            }
        ],
        "evidence": [],
        "firstDifference": {"detail": "toy-accuracy was 0.819, became 0.82 in replay 1"},
    }
    text = page.render(_data(_envelope(), resources=[res], replay=replay))
    tags = _parse(text)
    assert 'id="resources"' in text and 'id="replay"' in text
    assert "became 0.82 in replay 1" in text and "0.12 %" in text
    assert sum(1 for t, _ in tags.tags if t == "polyline") == 1
    assert "cpuSeconds" in " ".join(tags.text)


# -- the excerpt -------------------------------------------------------------------------------


def test_the_excerpt_is_the_lines_around_the_value(tmp_path: Path) -> None:
    lines = [f"epoch {i}: loss 0.{i}" for i in range(10)] + ['{"accuracy": 0.819}', "done"]
    (tmp_path / "log").write_text("\n".join(lines) + "\n")
    ex = excerpt(tmp_path, "log", 0.819)
    assert ex.problem is None and ex.hit is not None and ex.span is not None
    assert ex.lines[ex.hit] == '{"accuracy": 0.819}' and ex.line_number == 11
    a, b = ex.span
    assert ex.lines[ex.hit][a:b] == "0.819"
    assert ex.lines == tuple(lines[8:12])


@pytest.mark.hostile
def test_a_huge_line_is_cut_around_the_value(tmp_path: Path) -> None:
    (tmp_path / "log").write_text("x" * 500_000 + " accuracy=0.819 " + "y" * 500_000)
    ex = excerpt(tmp_path, "log", 0.819)
    assert ex.hit == 0 and ex.span is not None and len(ex.lines[0]) <= LINE_CAP
    a, b = ex.span
    assert ex.lines[0][a:b] == "0.819"


@pytest.mark.hostile
def test_a_value_in_the_tail_of_a_big_file_is_found_and_no_more_is_read(tmp_path: Path) -> None:
    with (tmp_path / "log").open("w") as f:
        f.write(("noise\n" * (3 * READ_CAP // 6)) + "accuracy 0.819\n")
    ex = excerpt(tmp_path, "log", 0.819)
    assert ex.hit is not None and "0.819" in ex.lines[ex.hit] and ex.line_number is None
    assert sum(len(x) for x in ex.lines) <= EXCERPT_CAP


@pytest.mark.hostile
def test_links_special_files_and_escapes_are_not_read(tmp_path: Path) -> None:
    out = tmp_path / "output"
    out.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("0.819 host secret\n")
    (out / "link").symlink_to(secret)
    (out / "dir").symlink_to(tmp_path)
    os.mkfifo(out / "fifo")
    for rel, says in (
        ("link", "symbolic link"),
        ("dir/secret.txt", "symbolic link"),
        ("fifo", "FIFO"),
        ("../secret.txt", "leaves its folder"),
        ("/etc/passwd", "leaves its folder"),
        ("none", "does not exist"),
    ):
        ex = excerpt(out, rel, 0.819)
        assert ex.lines == () and ex.problem and says in ex.problem, (rel, ex)


# -- pages of hostile runs ---------------------------------------------------------------------

HOSTILE = "</script><script>alert(1)</script><img src=x onerror=alert(2)> 0.819 \"'<b>&amp;"


def hostile_data(tmp_path: Path) -> ReportData:
    """A run whose every string it controls is :data:`HOSTILE` (the browser test opens it)."""
    (tmp_path / "log").write_text(f"{HOSTILE}\n\x1b[31m\x00\u202e{HOSTILE}\n")
    env = _envelope(
        jobId=HOSTILE,
        status="failed",
        failure={
            "category": "nonzero_exit",
            "stage": "container",
            "retryable": False,
            "reason": HOSTILE * 1000,
        },
        warnings=[HOSTILE],
        measurements=[
            {
                **_envelope()["measurements"][0],
                "measurementId": HOSTILE,
                "unit": HOSTILE,
                "value": HOSTILE,
            }
        ],
        egress={
            "allow": [HOSTILE],
            "allowed": 1,
            "refused": 0,
            "incomplete": 0,
            "log": HOSTILE,
            "connections": [
                {
                    "at": None,
                    "method": HOSTILE,
                    "target": HOSTILE,
                    "decision": "refused",
                    "detail": HOSTILE,
                }
            ]
            * 500,
            "problems": [HOSTILE],
        },
    )
    return _data(
        env,
        excerpts={HOSTILE: excerpt(tmp_path, "log", 0.819)},
        verification=Verification("v", False, HOSTILE, (Check(HOSTILE, HOSTILE, HOSTILE),)),
        replay={HOSTILE: HOSTILE},
    )


@pytest.mark.hostile
def test_hostile_text_anywhere_stays_text(tmp_path: Path) -> None:
    text = page.render(hostile_data(tmp_path))
    tags = _parse(text)
    assert {t for t, _ in tags.tags} <= ALLOWED_TAGS
    assert "<script" not in text.lower() and "<img" not in text.lower()
    assert not [a for _, attrs in tags.tags for a in attrs if a.startswith("on") or a == "src"]
    assert "\x1b" not in text and "\x00" not in text and "\u202e" not in text
    assert HOSTILE in "".join(tags.text)  # shown, as text
    assert "more characters" in text and "more rows not shown" in text  # capped
    assert len(text) < 1_000_000


# -- from a job folder, and the command --------------------------------------------------------


def _job(tmp_path: Path, fake: FakeBackend, work: Any = None) -> Path:
    if work is not None:
        fake.jobs = FakeJob(work=work)
    from runner.app import host

    contract = _contract(tmp_path, _image(fake))
    env = _run(contract, _options(tmp_path, result_key=host.result_key_path(None)), fake)
    return Path(env["jobDir"])


def test_a_job_folder_page_verifies_its_signed_result(tmp_path: Path, fake: FakeBackend) -> None:
    job = _job(tmp_path, fake)
    data = report.from_job(job, _own_keys())
    assert data.verification.valid, data.verification
    assert data.attempts[0]["attempt"] == 1 and data.attempts[0]["startedAt"]
    ex = data.excerpts["toy-accuracy"]
    assert ex.hit is not None and "0.819" in ex.lines[ex.hit]
    words = " ".join(_parse(page.render(data)).text)
    assert "0.819" in words and "verifies" in words


@pytest.mark.hostile
def test_evidence_changed_after_the_run_fails_verification_and_a_link_is_not_followed(
    tmp_path: Path, fake: FakeBackend
) -> None:
    job = _job(tmp_path, fake)
    evidence = job / "output" / "logs" / "evaluation.log"
    outside = tmp_path / "outside.log"
    outside.write_text('{"accuracy": 0.819} outside the job\n')
    evidence.unlink()
    evidence.symlink_to(outside)
    data = report.from_job(job, _own_keys())
    assert not data.verification.valid
    assert "does not verify" in data.verification.summary
    ex = data.excerpts["toy-accuracy"]
    assert ex.lines == () and ex.problem and "symbolic link" in ex.problem
    assert "outside the job" not in page.render(data)


def _own_keys() -> list[Any]:
    from runner.cli._common import own_runner_keys

    return own_runner_keys()


def test_the_command_writes_the_page_and_says_where(tmp_path: Path, fake: FakeBackend) -> None:
    job = _job(tmp_path, fake)
    out = tmp_path / "page.html"
    proc = run_cli("report", str(job), "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info == {
        "report": str(out),
        "job": job.name,
        "status": "succeeded",
        "from": "job",
        "verified": True,
    }
    assert "0.819" in out.read_text()
    again = run_cli("report", str(job), "-o", str(out))
    assert again.returncode == 2 and "--force" in again.stderr
    assert run_cli("report", str(job), "-o", str(out), "--force").returncode == 0


def test_the_command_names_a_missing_job_and_a_bad_bundle(tmp_path: Path) -> None:
    proc = run_cli("report", "no-such-job", "--state-dir", str(tmp_path), "--json")
    assert proc.returncode == 5 and "no-such-job" in proc.stderr
    unfinished = tmp_path / "state" / "jobs" / "unfinished"
    (unfinished / "record").mkdir(parents=True)
    proc = run_cli("report", str(unfinished), "-o", str(tmp_path / "u.html"))
    assert proc.returncode == 3 and "result.json does not exist" in proc.stderr, proc.stderr
    assert "runner job status" in proc.stderr
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a bundle")
    proc = run_cli("report", str(junk), "-o", str(tmp_path / "x.html"))
    assert proc.returncode == 3 and "junk.tar.gz" in proc.stderr, proc.stderr
    assert not (tmp_path / "x.html").exists()


@pytest.mark.hostile
def test_a_bundles_job_id_never_names_the_default_file() -> None:
    from runner.cli.report import _safe_name

    assert _safe_name({"jobId": "../../etc/cron.d/x"}) == "result"
    assert _safe_name({"jobId": None}) == "result"
    assert _safe_name({"jobId": "toy-1"}) == "toy-1"


def test_the_page_is_written_whole(tmp_path: Path) -> None:
    path = report.write(_data(_envelope()), tmp_path / "r.html")
    assert path.read_text().endswith("</html>\n")


# -- from a bundle -----------------------------------------------------------------------------


def _bundle(tmp_path: Path, fake: FakeBackend, name: str = "run.tar") -> tuple[Path, Path]:
    job = _job(tmp_path, fake)
    archive = tmp_path / name
    proc = run_cli("export", str(job), "-o", str(archive))
    assert proc.returncode == 0, proc.stderr
    return job, archive


def test_a_bundles_page_is_checked_as_verify_bundle_checks_it(
    tmp_path: Path, fake: FakeBackend
) -> None:
    import shutil

    job, archive = _bundle(tmp_path, fake)
    shutil.rmtree(job)
    out = tmp_path / "b.html"
    proc = run_cli("report", str(archive), "-o", str(out), "--json", "--allow-untrusted")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verified"] is True
    words = " ".join(_parse(out.read_text()).text)
    assert "0.819" in words and "runner verify bundle" in words and "unverified" in words
    strict = run_cli("report", str(archive), "-o", str(tmp_path / "s.html"), "--json")
    assert strict.returncode == 0 and json.loads(strict.stdout)["verified"] is False
    # --allow-untrusted is the bundle's: a job folder is checked as verify result checks it
    proc = run_cli("report", str(tmp_path), "--allow-untrusted")
    assert proc.returncode == 2 and "for a bundle" in proc.stderr


@pytest.mark.hostile
def test_a_bundle_with_changed_evidence_gets_a_page_that_says_so(
    tmp_path: Path, fake: FakeBackend
) -> None:
    import tarfile

    _, archive = _bundle(tmp_path, fake)
    with tarfile.open(archive) as tar:
        (member,) = [m for m in tar.getmembers() if m.name.endswith("output/logs/evaluation.log")]
    data = bytearray(archive.read_bytes())
    at = data.index(b"0.819", member.offset_data)
    data[at : at + 5] = b"0.918"
    archive.write_bytes(bytes(data))
    built = report.from_bundle(archive, _bundle_keys(), allow_untrusted=True)
    assert not built.verification.valid
    assert "evaluation.log" in built.verification.summary
    failed = [c.name for c in built.verification.checks if c.status == "failed"]
    assert "payload" in failed
    text = page.render(built)
    assert "does not verify" in text and "0.918" in text  # what the bundle holds, marked bad


def _bundle_keys() -> Any:
    from runner.results.bundle.verify import Keys

    return Keys(runner=_own_keys(), issuer=[])


@pytest.mark.hostile
def test_numbers_too_long_to_print_are_shown_by_their_size() -> None:
    """Python refuses to turn an integer of more than 4,300 digits into text; an envelope may
    hold one (JSON has no limit), and the page is written all the same."""
    huge = 10**5000
    env = _envelope(exitCode=huge, revision=-huge)
    env["measurements"][0]["value"] = huge
    usage = {
        "source": "claude-code",
        "maxTurns": huge,
        "maxBudgetUsd": None,
        "turns": huge,
        "costUsd": 0.0,
        "attempts": [{"attempt": huge, "turns": huge, "costUsd": 0.0}],
    }
    res = {
        "attempt": huge,
        "caps": {"memoryBytes": huge},
        "series": [
            {"t": 0, "memoryBytes": huge},
            {"t": huge, "memoryBytes": 1},
            {"t": 1, "memoryBytes": 2},
            {"t": 2, "memoryBytes": 3},
        ],
    }
    attempts = [{**_data(env).attempts[0], "attempt": huge}]
    text = page.render(
        _data(_envelope(**env, agentUsage=usage), attempts=attempts, resources=[res])
    )
    assert "(a number of about 5,000 digits)" in text and "-(a number of about" in text
    (points,) = [a["points"] for t, a in _parse(text).tags if t == "polyline"]
    assert points is not None and "nan" not in points and "inf" not in points
    assert points.count(",") == 2  # the samples of finite figures only


@pytest.mark.hostile
def test_an_envelope_of_many_measurements_reads_a_capped_number_of_excerpts(
    tmp_path: Path, fake: FakeBackend
) -> None:
    from runner.results.report.gather import EXCERPTS_CAP

    job = _job(tmp_path, fake)
    env = json.loads((job / "result.json").read_text())
    (m,) = env["measurements"]
    env["measurements"] = [{**m, "measurementId": f"m{i}"} for i in range(5 * EXCERPTS_CAP)]
    (job / "result.json").write_text(json.dumps(env))
    data = report.from_job(job, _own_keys())
    assert len(data.excerpts) == EXCERPTS_CAP
    assert not data.verification.valid  # the envelope is not the one signed
    text = page.render(data)
    assert text.count('class="measurement"') == EXCERPTS_CAP
    assert f"{4 * EXCERPTS_CAP:,} more measurements not shown" in text


@pytest.mark.hostile
def test_a_jobs_replay_report_is_read_only_as_the_runner_wrote_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """record/replays.json: none is no section; a link is not followed (a file of the host's
    is not shown); a file that is not a report, or is over the cap, says so and shows nothing
    of it."""
    from runner.results.report import gather

    record = tmp_path / "record"
    record.mkdir()
    assert gather.replay_of(tmp_path) is None
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"summary": "host secret"}))
    (record / "replays.json").symlink_to(secret)
    assert gather.replay_of(tmp_path) is None
    (record / "replays.json").unlink()
    (record / "replays.json").write_text(json.dumps({"summary": "<b>forged</b>"}))
    said = gather.replay_of(tmp_path)
    assert (
        said is not None and set(said) == {"problem"} and "not a replay report" in said["problem"]
    )
    text = page.render(_data(_envelope(), replay=said))
    assert "forged" not in text and "not a replay report" in text
    monkeypatch.setattr(gather, "REPLAY_CAP", 16)
    said = gather.replay_of(tmp_path)
    assert said is not None and "over 16 bytes" in said["problem"]


@pytest.mark.hostile
def test_an_attempts_series_is_read_only_from_its_own_record_file(tmp_path: Path) -> None:
    """The envelope names the series' file; the page reads it only as
    record/attempts/<n>/resources.json below the job, not through a link, and only when it is
    a resource record: a path elsewhere, a link or another file draws no curve."""
    from runner.results.report import gather

    folder = tmp_path / "record" / "attempts" / "1"
    folder.mkdir(parents=True)
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    env = {"attempts": [{"attempt": 1, "resources": {"samples": 2, "memoryLimitBytes": 10,
                                                     "series": "../secret.json"}}]}  # fmt: skip
    (shown,) = gather.resources_of(env, tmp_path)
    assert "series" not in shown and shown["caps"] == {"memoryBytes": 10}
    env["attempts"][0]["resources"]["series"] = "record/attempts/1/resources.json"
    (folder / "resources.json").symlink_to(secret)
    assert "series" not in gather.resources_of(env, tmp_path)[0]
    (folder / "resources.json").unlink()
    (folder / "resources.json").write_text('{"not": "a record"}')
    assert "series" not in gather.resources_of(env, tmp_path)[0]
