"""Round 17's review, the report, re-grade and quoting holes: an agent's key reached the report
page, a re-graded result.json and the envelope's reasons (as pieces no redaction finds).

No engine: each job runs on the fake backend through the orchestrator's one redaction step
(as ``tests/unit/test_hostile_secrets.py``'s), then the command under test reads its folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.core.errors import RefusedError
from runner.core.redaction import Redactor
from tests.support import run_cli
from tests.unit.test_hostile_secrets import KEY, fake_agent_run, holding

GIVEN = {"API_KEY": KEY}


def pieces(text: str, n: int = 10) -> list[str]:
    """The pieces of ``n`` characters of the key that ``text`` holds."""
    return sorted({KEY[i : i + n] for i in range(len(KEY) - n + 1) if KEY[i : i + n] in text})


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> Path:
    """The scripted agent's job (its key API_KEY) that writes ``files`` under output/; its
    job folder."""

    def work(mounts: dict[str, Path]) -> None:
        out = mounts["/job/output"]
        (out / "logs").mkdir(parents=True, exist_ok=True)
        (out / "logs" / "stdout.log").write_text(
            json.dumps({"type": "assistant", "message": {"id": "m1", "content": []}}) + "\n"
            + json.dumps({"type": "result", "subtype": "success", "num_turns": 1}) + "\n"
        )  # fmt: skip
        for rel, text in files.items():
            (out / rel).write_text(text)

    env = fake_agent_run(tmp_path, monkeypatch, work)
    assert holding(json.dumps(env).encode()) == [] and pieces(json.dumps(env)) == []
    return Path(env["jobDir"])


def _adapters() -> dict[str, Any]:
    from tests.unit.test_agents import _policy

    return dict(_policy().resolved().agents)


# --- 1. `runner report JOB`: no excerpt of a withheld file, every excerpt redacted -----------


def test_the_report_shows_no_excerpt_of_evidence_withheld_for_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the run withheld logs/evaluation.log from export (it held the key beside the
    value), but `runner report JOB` excerpted its lines, key and all, into the HTML page. Now
    the page shows no excerpt of it and says it is withheld, and why."""
    from runner.results import report

    evaluation = json.dumps({"note": KEY, "accuracy": 0.819}, indent=1)
    job = _run(tmp_path, monkeypatch, {"logs/evaluation.log": evaluation})
    data = report.from_job(job, [])
    page = report.render(data)
    assert holding(page.encode()) == [] and pieces(page) == []
    shown = data.excerpts["toy-accuracy"]
    assert shown.lines == () and shown.problem is not None
    assert "withheld from export" in shown.problem and "API_KEY" in shown.problem
    # the CLI's page too, with or without a policy naming the key
    for extra in ([], ["--policy", str(tmp_path / "none.json")]):
        out = tmp_path / f"page{len(extra)}.html"
        (tmp_path / "none.json").write_text("{}")
        done = run_cli("report", str(job), "-o", str(out), *extra)
        assert done.returncode == 0, done.stderr
        assert holding(out.read_bytes()) == [] and pieces(out.read_text()) == []


def test_the_report_redacts_every_excerpt_before_cutting_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: an excerpt was the evidence's raw lines, each cut to 240 characters around the
    value, so a key on a long line (in a file not withheld: its list lost, say) reached the page
    whole or as a piece. Now what is read is redacted whole by the job's step first; where the
    step cannot be had (the policy names no secret the attempts were given), no excerpt is
    shown at all."""
    from runner.results import report
    from runner.results.report.excerpt import LINE_CAP, READ_CAP, excerpt

    line = "x" * (LINE_CAP - 40) + KEY + " accuracy 0.819 " + "y" * 400
    (tmp_path / "ev.log").write_text(f"a\n{line}\nb\n")
    plain = excerpt(tmp_path, "ev.log", 0.819)
    assert pieces("\n".join(plain.lines))  # the hole: a piece of the key, cut at its start
    redact = Redactor(GIVEN)
    shown = excerpt(tmp_path, "ev.log", 0.819, redact=redact)
    assert pieces("\n".join(shown.lines)) == [] and shown.hit is not None
    # a key astride the end of the head read (a file longer than one read) is not cut there
    (tmp_path / "big.log").write_bytes(b"z" * (READ_CAP - 20) + KEY.encode() + b"\n" * 100)
    head = excerpt(tmp_path, "big.log", "absent", redact=redact)
    assert pieces("\n".join(head.lines), 6) == []

    evaluation = json.dumps({"accuracy": 0.819, "note": "clean"})
    job = _run(tmp_path, monkeypatch, {"logs/evaluation.log": evaluation})
    blind = report.from_job(job, [], redaction=lambda runtime: Redactor({}).blinded("no key"))
    assert blind.excerpts["toy-accuracy"].lines == ()
    assert "not shown: no key" in str(blind.excerpts["toy-accuracy"].problem)
    out = tmp_path / "page.html"
    (tmp_path / "none.json").write_text("{}")
    done = run_cli("report", str(job), "-o", str(out), "--policy", str(tmp_path / "none.json"))
    assert done.returncode == 0, done.stderr
    assert "was given the agent secret API_KEY" in out.read_text()


# --- 2. `runner job regrade`: decided from the ledger's secretDigests ------------------------


def _escaped_claim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A job whose result.json holds the key as JSON \\u escapes (no file scan finds that
    form, so nothing is withheld), its evidence clean."""
    escaped = "".join(f"\\u{ord(c):04x}" for c in KEY)
    claim = json.dumps(
        {"schemaVersion": "2.0", "status": "completed", "summary": "@@", "evidence": []}
    ).replace("@@", escaped)
    files = {"logs/evaluation.log": json.dumps({"accuracy": 0.819}), "result.json": claim}
    job = _run(tmp_path, monkeypatch, files)
    assert not (job / "record" / "withheld.json").exists()
    return job


def test_regrade_refuses_without_the_secrets_the_ledger_says_were_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `runner job regrade` decided whether to redact from record/withheld.json alone;
    the key written as \\u escapes left none, so without --policy it re-parsed with no
    redaction and wrote the decoded key plain into result.json (its signed statement, --json,
    the export). Now the ledger decides: an attempt recorded secretDigests, so a re-grade with
    no policy naming the secret is refused, naming the fix, and writes nothing."""
    from runner.app.regrade import regrade

    job = _escaped_claim(tmp_path, monkeypatch)
    before = (job / "result.json").read_bytes()
    with pytest.raises(RefusedError, match="was given the agent secret API_KEY") as refused:
        regrade(job, latest=False, max_bytes=1 << 20, result_key=None, agent_adapters={})
    assert "--policy" in str(refused.value.hint)
    assert (job / "result.json").read_bytes() == before
    done = run_cli("job", "regrade", str(job), "--json", env={"RUNNER_CONFIG_DIR": str(tmp_path)})
    assert done.returncode == 3, done.stderr
    assert holding((done.stdout + done.stderr).encode()) == []
    assert holding((job / "result.json").read_bytes()) == []


def test_regrade_refuses_a_rotated_key_and_redacts_the_one_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: with --policy after the key was rotated, the re-grade redacted only the new
    value and wrote the old one, decoded, into result.json. Now the secrets read are checked
    against the ledger's digests (the redactor's ``differs()``): a rotated key is refused; the
    key the attempts were given is redacted out of the new envelope."""
    from runner.app.regrade import regrade

    job = _escaped_claim(tmp_path, monkeypatch)
    monkeypatch.setenv("RUNNER_TEST_AGENT_KEY", "sk-ant-rotated-" + "r" * 40)
    with pytest.raises(RefusedError, match="rotated"):
        regrade(job, latest=False, max_bytes=1 << 20, result_key=None, agent_adapters=_adapters())
    assert holding((job / "result.json").read_bytes()) == []
    monkeypatch.setenv("RUNNER_TEST_AGENT_KEY", KEY)
    new = regrade(job, latest=False, max_bytes=1 << 20, result_key=None, agent_adapters=_adapters())
    assert new.regrade is not None and holding((job / "result.json").read_bytes()) == []
    assert "[redacted: API_KEY]" in json.dumps(new.model_dump(mode="json"))


# --- 3. what a reason quotes of a job's file: redacted whole, then cut -----------------------


def test_a_parser_quote_is_redacted_before_it_is_cut(tmp_path: Path) -> None:
    """Before: `show()` cut the found value to 57 characters, so the reason held a piece of the
    key that the envelope's redaction could not match. Now, under the run's step, the value is
    redacted whole first."""
    from runner.core.errors import EvidenceParseError
    from runner.core.redaction import quoting
    from runner.parsers.json_scalar import read_pointer

    f = tmp_path / "evaluation.log"
    f.write_text(json.dumps({"accuracy": KEY + KEY}))
    with pytest.raises(EvidenceParseError) as plain:
        read_pointer(f, "/accuracy", "number")
    assert pieces(Redactor(GIVEN).text(str(plain.value)))  # the hole, without the step
    with quoting(Redactor(GIVEN)), pytest.raises(EvidenceParseError) as caught:
        read_pointer(f, "/accuracy", "number")
    assert pieces(str(caught.value)) == [] and "[redacted: API_KEY]" in str(caught.value)
    with quoting(Redactor(GIVEN).blinded("rotated")), pytest.raises(EvidenceParseError) as blind:
        read_pointer(f, "/accuracy", "number")
    assert pieces(str(blind.value)) == [] and "not shown" in str(blind.value)


@pytest.mark.parametrize(
    "files",
    [
        # yajl's "near:" window around an unquoted key, cut by yajl and at 60
        {"logs/evaluation.log": '{"api_key": ' + KEY + ', "accuracy": 0.819}\n'},
        # show(): the value found, cut at 57
        {"logs/evaluation.log": json.dumps({"accuracy": "x" * 30 + KEY})},
        # the self-report's quote of a listed path, cut at 200
        {
            "logs/evaluation.log": json.dumps({"accuracy": 0.819}),
            "result.json": json.dumps(
                {
                    "schemaVersion": "2.0",
                    "status": "completed",
                    "summary": "done",
                    "evidence": [{"path": "/" + "p" * 180 + KEY}],
                }
            ),
        },
    ],
    ids=["yajl-near", "show", "selfreport-quote"],
)
def test_no_piece_of_the_key_reaches_the_envelope(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]
) -> None:
    """Before: the runner's own excerpts (yajl's `near:` in `_json._detail`, `show()`, the
    self-report's `_quote`) cut the key into pieces that reached failure.reason,
    measurementErrors and agentResult in result.json, its signed statement and the bundle.
    Now no piece of it is in the envelope (:func:`_run` checks every string of it)."""
    job = _run(tmp_path, monkeypatch, files)
    assert pieces((job / "result.json").read_text()) == []


def test_a_tail_read_with_no_line_break_is_not_quoted_cut(tmp_path: Path) -> None:
    """The tail read of a long file whose last line began before it, with no line break in
    it: the partial line to drop was found with ``find``, whose -1 kept the whole tail, so a
    key cut at the tail's start reached the page as a piece. Now such a tail is dropped."""
    from runner.results.report.excerpt import READ_CAP, excerpt

    cut = 20  # the tail read starts 20 characters into the key
    body = b"a\n" + b"z" * (2 * READ_CAP) + KEY.encode() + b"q" * (READ_CAP - len(KEY) + cut)
    (tmp_path / "long.log").write_bytes(body)
    shown = excerpt(tmp_path, "long.log", "q", redact=Redactor(GIVEN))
    assert pieces("\n".join(shown.lines), 6) == []


def test_a_withheld_file_spelled_another_way_is_not_excerpted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A contract may name its evidence ``./logs/evaluation.log``; the run lists the file it
    withheld as ``output/logs/evaluation.log``. The report matched the two as text, so the
    withheld file was excerpted. Now both are normalized first."""
    from runner.models.envelope import ResultEnvelope
    from runner.results.report.gather import _withheld

    job = _run(tmp_path, monkeypatch, {"logs/evaluation.log": json.dumps({"accuracy": 0.819})})
    envelope = ResultEnvelope.model_validate_json((job / "result.json").read_bytes())
    held = _withheld(envelope, {"output/./logs//evaluation.log": "it holds API_KEY"})
    assert held == {"output/logs/evaluation.log": "it holds API_KEY"}
