"""`runner replay`: the comparison of a job with its replays (pure functions over envelopes), and
the replays themselves driven by the in-memory fake backend (no engine): fresh linked jobs, the
report in the original's record/replays.json, the contract taken from the job folder and checked.
The same paths against the real engine: tests/integration/test_replay.py."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from runner.app import replay
from runner.backends.fake import FakeBackend, FakeJob
from runner.contract import Trust
from runner.core.errors import PolicyViolation, RefusedError
from runner.execution import orchestrator
from runner.models.envelope import ResultEnvelope
from runner.models.replay import ReplayLink, ReplayReport
from runner.planning import policy
from runner.results.replay import Binding, compare, run_record, shown, summary, usable
from tests.support import run_cli
from tests.support.clock import VirtualClock
from tests.unit.test_orchestrator_fake import _contract

DIGEST = "sha256:" + "c" * 64
ORDER = [
    Binding("acc", "accuracy", "fraction", "logs/eval.json"),
    Binding("loss", "loss", "nats", "logs/eval.json"),
    Binding("n", "count", "items", "logs/count.txt"),
]


def _envelope(
    values: dict[str, Any] | None = None,
    *,
    sha: dict[str, str] | None = None,
    errors: dict[str, str] | None = None,
    status: str = "succeeded",
    failure: dict[str, Any] | None = None,
    job: str = "j",
) -> ResultEnvelope:
    """An envelope with ``values`` read (each from its ORDER evidence file, hashed as ``sha``
    says, else "0"*64) and ``errors`` (measurement id -> category)."""
    paths = {b.measurement_id: b.evidence_path for b in ORDER}
    sha = sha or {}
    measurements = [
        {
            "measurementId": mid,
            "metric": "m",
            "unit": "u",
            "value": value,
            "parser": {"id": "json.scalar", "version": "1"},
            "evidence": {
                "path": paths[mid],
                "sha256": "sha256:" + sha.get(paths[mid], "0" * 64),
                "size": 10,
            },
        }
        for mid, value in (values or {}).items()
    ]
    return ResultEnvelope.model_validate(
        {
            "runnerVersion": "0",
            "jobId": job,
            "contractDigest": DIGEST,
            "status": status,
            "failure": failure,
            "exitCode": 0,
            "image": None,
            "measurements": measurements,
            "measurementErrors": [
                {"measurementId": mid, "category": cat, "reason": "r"}
                for mid, cat in (errors or {}).items()
            ],
            "limits": None,
            "timings": {"startedAt": "t", "finishedAt": "t", "totalSeconds": 1.0},
        }
    )


SAME = {"acc": 0.8, "loss": 1.5, "n": 10}


def _runs(envelopes: list[ResultEnvelope | None]) -> tuple[Any, list[Any]]:
    runs = [
        run_record(i, e, job_id=f"job-{i}", job_dir=None, contract_digest=DIGEST)
        for i, e in enumerate(envelopes)
    ]
    got = compare(ORDER, [usable(r, e) for r, e in zip(runs, envelopes, strict=True)],
                  [r.jobId for r in runs])  # fmt: skip
    return got, runs


def test_identical_runs_are_identical() -> None:
    got, runs = _runs([_envelope(SAME), _envelope(SAME), _envelope(SAME)])
    assert all(m.identical for m in got.measurements)
    assert [m.measurementId for m in got.measurements] == ["acc", "loss", "n"]
    # two measurements read one file: one evidence entry, in the contract's order
    assert [(e.path, e.measurementIds) for e in got.evidence] == [
        ("logs/eval.json", ["acc", "loss"]),
        ("logs/count.txt", ["n"]),
    ]
    assert all(e.identical for e in got.evidence)
    assert got.first is None
    acc = got.measurements[0]
    assert (acc.min, acc.max, acc.range, acc.relativeSpread) == (0.8, 0.8, 0.0, 0.0)
    same, failed, text = summary(got, runs, 2, complete=True)
    assert same and failed == []
    assert text.startswith("All 2 replays reproduced the original exactly")


def test_differing_numbers_name_the_first_difference_and_their_spread() -> None:
    sha_a, sha_b = {"logs/eval.json": "a" * 64}, {"logs/eval.json": "b" * 64}
    envelopes: list[ResultEnvelope | None] = [
        _envelope(SAME, sha=sha_a),
        _envelope(SAME, sha=sha_a),
        _envelope({**SAME, "loss": 1.8}, sha=sha_b),
    ]
    got, runs = _runs(envelopes)
    acc, loss, n = got.measurements
    assert acc.identical and n.identical and not loss.identical
    assert loss.firstDifferentRun == 2
    assert loss.min == 1.5 and loss.max == 1.8
    assert loss.range == pytest.approx(0.3)
    assert loss.relativeSpread == pytest.approx(0.3 / 1.6)
    assert [v.value for v in loss.values] == [1.5, 1.5, 1.8]
    assert not got.evidence[0].identical and got.evidence[0].firstDifferentRun == 2
    # in the contract's order: acc (the same), then the file acc reads (it differs): first
    assert got.first is not None
    assert (got.first.kind, got.first.path, got.first.run, got.first.jobId) == (
        "evidence",
        "logs/eval.json",
        2,
        "job-2",
    )
    same, failed, text = summary(got, runs, 2, complete=True)
    assert not same and failed == []
    assert "1 of 3 measurements and 1 of 2 evidence files differ" in text
    # a value that differs before its file is named first, with both values
    envelopes[2] = _envelope({**SAME, "acc": 0.7}, sha=sha_b)
    got, _ = _runs(envelopes)
    assert got.first is not None
    assert (got.first.kind, got.first.measurementId, got.first.run) == ("measurement", "acc", 2)
    assert "0.8" in got.first.detail and "0.7" in got.first.detail


def test_integers_spread_exactly() -> None:
    got, _ = _runs([_envelope({"n": 10}), _envelope({"n": 14}), _envelope({"n": 12})])
    n = got.measurements[2]
    assert (n.min, n.max, n.range) == (10, 14, 4)
    assert isinstance(n.range, int)
    assert n.relativeSpread == pytest.approx(4 / 12)


def test_differing_evidence_bytes_with_the_same_values() -> None:
    """A log with a timestamp: the value is the same, the file is not; the file is named."""
    envelopes: list[ResultEnvelope | None] = [
        _envelope(SAME, sha={"logs/count.txt": "1" * 64}),
        _envelope(SAME, sha={"logs/count.txt": "2" * 64}),
    ]
    got, runs = _runs(envelopes)
    assert all(m.identical for m in got.measurements)
    count = got.evidence[1]
    assert not count.identical and count.firstDifferentRun == 1
    assert [h.sha256 for h in count.hashes] == ["sha256:" + "1" * 64, "sha256:" + "2" * 64]
    assert got.first is not None
    assert (got.first.kind, got.first.path, got.first.run) == ("evidence", "logs/count.txt", 1)
    assert not summary(got, runs, 1, complete=True)[0]


def test_a_failed_replay_is_reported_not_hidden() -> None:
    failure = {"category": "nonzero_exit", "stage": "container", "retryable": False, "reason": "x"}
    envelopes: list[ResultEnvelope | None] = [
        _envelope(SAME),
        _envelope(SAME),
        _envelope(status="failed", failure=failure),
        None,  # a replay that left no envelope at all
    ]
    got, runs = _runs(envelopes)
    assert [r.failed for r in runs] == [False, False, True, True]
    assert runs[3].problem == "it left no envelope"
    acc = got.measurements[0]
    assert not acc.identical and acc.firstDifferentRun == 2
    assert acc.values[2].value is None
    assert acc.values[2].missing == "run failed: nonzero_exit at container"
    assert acc.values[3].missing == "run failed: no envelope"
    assert (acc.min, acc.max) == (0.8, 0.8)  # over the values read
    same, failed, text = summary(got, runs, 3, complete=True)
    assert not same and failed == [2, 3]
    assert "2 of 3 replays failed (run 2, 3)" in text
    assert got.first is not None and got.first.run == 2
    assert "nothing (run failed: nonzero_exit at container)" in got.first.detail


def test_a_replay_that_ran_another_contract_is_not_compared() -> None:
    other = _envelope(SAME).model_copy(update={"contractDigest": "sha256:" + "d" * 64})
    run = run_record(1, other, job_id="r", job_dir=None, contract_digest=DIGEST)
    assert run.failed and run.problem is not None and "not the original's" in run.problem
    assert usable(run, other) is None


def test_a_missing_measurement_differs() -> None:
    envelopes: list[ResultEnvelope | None] = [
        _envelope(SAME),
        _envelope({"acc": 0.8, "n": 10}, errors={"loss": "parse_error"}, status="partial"),
    ]
    got, runs = _runs(envelopes)
    loss = got.measurements[1]
    assert not loss.identical and loss.values[1].missing == "parse_error"
    assert got.first is not None and got.first.measurementId == "loss"
    # the evidence file still hashed the same (acc read it): its bytes are identical
    assert got.evidence[0].identical
    assert runs[1].failed  # partial is not a success


def test_missing_in_every_run_is_identical_but_not_a_success() -> None:
    envelopes: list[ResultEnvelope | None] = [
        _envelope({"acc": 0.8, "loss": 1.5}, errors={"n": "missing_evidence"}, status="partial"),
        _envelope({"acc": 0.8, "loss": 1.5}, errors={"n": "missing_evidence"}, status="partial"),
    ]
    got, runs = _runs(envelopes)
    n = got.measurements[2]
    assert n.identical and (n.min, n.max, n.range) == (None, None, None)
    assert got.evidence[1].identical and got.evidence[1].hashes[0].sha256 is None
    same, failed, _ = summary(got, runs, 1, complete=True)
    assert same and failed == [1]  # the same outcome each time; the replay itself failed


def test_nan_equals_nan_and_has_no_spread() -> None:
    nan = float("nan")
    got, _ = _runs([_envelope({"acc": nan}), _envelope({"acc": nan})])
    acc = got.measurements[0]
    assert acc.identical
    assert (acc.min, acc.max, acc.range, acc.relativeSpread) == (None, None, None, None)
    got, _ = _runs([_envelope({"acc": nan}), _envelope({"acc": 0.5})])
    assert not got.measurements[0].identical
    assert got.measurements[0].range is None
    got, _ = _runs([_envelope({"acc": math.inf}), _envelope({"acc": 1.0})])
    acc = got.measurements[0]
    assert (acc.min, acc.max, acc.range, acc.relativeSpread) == (1.0, math.inf, None, None)


@pytest.mark.hostile
def test_nan_and_infinity_stay_json_in_the_report() -> None:
    """A non-finite value is written as a string, never a bare NaN (not JSON) nor null."""
    got, _ = _runs([_envelope({"acc": float("nan")}), _envelope({"acc": -math.inf})])
    text = got.measurements[0].model_dump_json()
    data = json.loads(text)  # strict JSON parses it
    assert [v["value"] for v in data["values"]] == ["NaN", "-Infinity"]
    assert "NaN," not in text.replace('"NaN"', "")


@pytest.mark.hostile
def test_hostile_values() -> None:
    # true is not 1, 1 is 1.0; an int past a float's range spreads exactly; mixed kinds no order
    got, _ = _runs([_envelope({"acc": True}), _envelope({"acc": 1})])
    assert not got.measurements[0].identical
    assert got.measurements[0].min is None
    got, _ = _runs([_envelope({"acc": 1}), _envelope({"acc": 1.0})])
    assert got.measurements[0].identical
    huge = 10**400
    got, _ = _runs([_envelope({"n": huge}), _envelope({"n": huge + 1}), _envelope({"n": 1.5})])
    n = got.measurements[2]
    assert not n.identical and n.max == huge + 1 and n.min == 1.5
    assert n.range is None  # huge - 1.5 does not fit a float: no range, no crash
    got, _ = _runs([_envelope({"n": huge}), _envelope({"n": huge + 2})])
    assert got.measurements[2].range == 2
    assert got.measurements[2].relativeSpread == pytest.approx(2 / (huge + 1), rel=1e-6)
    got, _ = _runs([_envelope({"n": -huge}), _envelope({"n": huge})])
    assert got.measurements[2].relativeSpread is None  # mean 0
    # strings: compared exactly, ordered by code point, shown escaped and short
    evil = "\x1b[2J\x00\ud800" + "x" * 10_000
    got, _ = _runs([_envelope({"acc": evil}), _envelope({"acc": evil + "!"})])
    acc = got.measurements[0]
    written = evil.replace("\ud800", "\ufffd")  # a lone surrogate is not UTF-8: U+FFFD
    assert not acc.identical and acc.min == written and acc.max == written + "!"
    assert acc.values[0].value == written
    assert got.first is not None
    assert "\x1b" not in got.first.detail and "\x00" not in got.first.detail
    assert len(got.first.detail) < 300
    assert shown(evil).isascii() and len(shown(evil)) <= 80
    assert shown(huge) == "<an integer of 401 digits>"
    json.loads(got.measurements[0].model_dump_json())  # a lone surrogate does not break it


# ------------------------------------------------------------ replays, on the fake backend


@pytest.fixture(autouse=True)
def _virtual_time(virtual_clock: VirtualClock) -> VirtualClock:
    return virtual_clock


def _writer(values: Callable[[], str]) -> Callable[[dict[str, Path]], None]:
    def work(mounts: dict[str, Path]) -> None:
        target = mounts["/job/output"] / "logs/evaluation.log"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(values())

    return work


def _options(tmp_path: Path, **fields: Any) -> orchestrator.RunOptions:
    loaded = policy.LoadedPolicy(
        policy.HostPolicy(acceptUnsigned=True, **fields).resolved(), "test"
    )
    return orchestrator.RunOptions(
        state_dir=tmp_path / "state",
        policy=loaded,
        trust=Trust(keys=[]),
        tick_seconds=0.01,
        heartbeat_seconds=0.05,
        stop_grace_seconds=0.05,
    )


def _original(tmp_path: Path, fake: FakeBackend) -> tuple[Path, orchestrator.RunOptions]:
    image = fake.add_image()
    (tmp_path / "src").mkdir()
    contract = _contract(tmp_path / "src", image)
    options = _options(tmp_path)
    env = orchestrator.run(contract, options, backend=fake)
    assert env.status == "succeeded", env.failure
    assert env.jobDir is not None
    return Path(env.jobDir), options


def _replay(root: Path, options: orchestrator.RunOptions, fake: FakeBackend, n: int) -> Any:
    return replay.replay(replay.original(root, options), options, n, backend=fake)


def test_replays_of_a_deterministic_job_are_identical_and_linked(tmp_path: Path) -> None:
    fake = FakeBackend(jobs=FakeJob(work=_writer(lambda: '{"accuracy": 0.819}\n')))
    root, options = _original(tmp_path, fake)
    report = _replay(root, options, fake, 2)
    assert report.identical and report.complete and report.failedReplays == []
    assert report.replays == [f"{root.name}-replay-1", f"{root.name}-replay-2"]
    written = ReplayReport.model_validate_json((root / "record" / "replays.json").read_bytes())
    assert written == report
    for n, job_id in enumerate(report.replays, 1):
        folder = root.parent / job_id
        assert report.runs[n].jobDir == str(folder)
        link = ReplayLink.model_validate_json((folder / "record" / "replay-of.json").read_bytes())
        assert (link.replayOf, link.run, link.contractDigest) == (
            root.name,
            n,
            report.contractDigest,
        )
        # a job of its own: its own ledger, its own envelope and budget
        env = ResultEnvelope.model_validate_json((folder / "result.json").read_bytes())
        assert env.jobId == job_id and env.contractDigest == report.contractDigest
        assert env.budget is not None and env.budget.attempts == 1
    # a second replay: fresh folders, the earlier replays still listed, the old report kept
    again = _replay(root, options, fake, 1)
    assert again.replays == [f"{root.name}-replay-3"]
    assert again.earlierReplays == report.replays
    assert len(list((root / "record").glob("replays-*.json"))) == 1


def test_replays_of_a_job_that_reads_the_clock_differ(tmp_path: Path) -> None:
    calls = iter(range(100))
    fake = FakeBackend(
        jobs=FakeJob(work=_writer(lambda: json.dumps({"accuracy": 0.5 + next(calls) / 100})))
    )
    root, options = _original(tmp_path, fake)
    report = _replay(root, options, fake, 2)
    assert not report.identical and report.failedReplays == []
    (m,) = report.measurements
    assert [v.value for v in m.values] == [0.5, 0.51, 0.52]
    assert m.range == pytest.approx(0.02) and not report.evidence[0].identical
    first = report.firstDifference
    assert first is not None
    assert (first.kind, first.measurementId, first.run) == ("measurement", "toy-accuracy", 1)
    assert first.jobId == f"{root.name}-replay-1"


def test_a_failed_replay_is_in_the_report(tmp_path: Path) -> None:
    runs = iter([0, 3])
    fake = FakeBackend(
        jobs=lambda spec: FakeJob(exit_code=next(runs, 0), work=_writer(lambda: '{"accuracy": 1}'))
    )
    root, options = _original(tmp_path, fake)
    report = _replay(root, options, fake, 2)
    assert report.failedReplays == [1] and not report.identical
    assert report.runs[1].failure is not None
    assert report.runs[1].failure.category == "nonzero_exit"
    assert report.runs[2].status == "succeeded"
    assert "1 of 2 replays failed (run 1)" in report.summary


def test_a_changed_staged_contract_is_refused(tmp_path: Path) -> None:
    fake = FakeBackend(jobs=FakeJob(work=_writer(lambda: '{"accuracy": 1}')))
    root, options = _original(tmp_path, fake)
    staged = root / "input" / "task.json"
    data = json.loads(staged.read_bytes())
    data["name"] = "another"
    staged.write_text(json.dumps(data))
    with pytest.raises(RefusedError) as caught:
        replay.original(root, options)
    assert "contractDigest" in str(caught.value) or "hashes to" in str(caught.value)
    assert not (root.parent / f"{root.name}-replay-1").exists()


@pytest.mark.hostile
def test_a_staged_contract_that_is_a_link_is_refused(tmp_path: Path) -> None:
    fake = FakeBackend(jobs=FakeJob(work=_writer(lambda: '{"accuracy": 1}')))
    root, options = _original(tmp_path, fake)
    staged = root / "input" / "task.json"
    (tmp_path / "copy.json").write_bytes(staged.read_bytes())
    staged.unlink()
    staged.symlink_to(tmp_path / "copy.json")
    with pytest.raises(RefusedError, match="symbolic link"):
        replay.original(root, options)


def test_a_job_with_no_result_is_refused(tmp_path: Path) -> None:
    fake = FakeBackend(jobs=FakeJob(work=_writer(lambda: '{"accuracy": 1}')))
    root, options = _original(tmp_path, fake)
    (root / "result.json").unlink()
    with pytest.raises(RefusedError, match="no result to replay"):
        replay.original(root, options)


def test_a_signed_contract_needs_the_policy_to_allow_another_job_id(tmp_path: Path) -> None:
    from runner.app import issuer
    from runner.trust import signing

    fake = FakeBackend(jobs=FakeJob(work=_writer(lambda: '{"accuracy": 1}')))
    image = fake.add_image()
    (tmp_path / "src").mkdir()
    contract = _contract(tmp_path / "src", image)
    key = tmp_path / "issuer"
    issuer.keygen(key)
    signed = issuer.sign(contract, key.with_suffix(".key"))
    trust = Trust(keys=[signing.load_public_key(key.with_suffix(".pub"))])
    options = _options(tmp_path)
    options = replace(options, trust=trust)
    env = orchestrator.run(signed.envelope, options, backend=fake)
    assert env.status == "succeeded" and env.jobDir is not None
    root = Path(env.jobDir)
    orig = replay.original(root, options)
    assert orig.contract_path == root / "input" / "task.dsse.json"
    with pytest.raises(PolicyViolation, match="allowJobIdOverride"):
        replay.replay(orig, options, 1, backend=fake)
    assert not (root.parent / f"{root.name}-replay-1").exists()
    allowed = _options(tmp_path, allowJobIdOverride=True)
    allowed = replace(allowed, trust=trust)
    report = replay.replay(replay.original(root, allowed), allowed, 1, backend=fake)
    assert report.identical and report.signed
    # an untrusted issuer: the staged signature no longer verifies on this host
    with pytest.raises(RefusedError):
        replay.original(root, _options(tmp_path))


def test_times_is_bounded_naming_the_flag(tmp_path: Path) -> None:
    for times in ("0", "21"):
        proc = run_cli("replay", "some-job", "--times", times, "--state-dir", str(tmp_path))
        assert proc.returncode == 2, proc.stderr
        assert "--times wants a number of replays from 1 to 20" in proc.stderr
    with pytest.raises(ValueError, match=r"1\.\.20"):
        replay.replay(None, _options(tmp_path), 0)  # type: ignore[arg-type]


@pytest.mark.hostile
def test_only_the_replayed_jobs_input_is_staged_from_inside_the_state_dir(tmp_path: Path) -> None:
    """The one exception to "nothing is staged from the runner's own folders" is a replay's, for
    exactly the replayed job's input/: that contract run by `runner run` is refused, and so is
    a replay that names another job's input/ as the one replayed."""
    fake = FakeBackend(jobs=FakeJob(work=_writer(lambda: '{"accuracy": 1}')))
    root, options = _original(tmp_path, fake)
    staged = root / "input" / "task.json"
    env = orchestrator.run(staged, replace(options, job_id="again"), backend=fake)
    assert env.failure is not None and env.failure.category == "invalid_contract"
    assert "inside the runner's own folder" in env.failure.reason
    other = tmp_path / "state" / "jobs" / "other" / "input"
    other.mkdir(parents=True)
    wrong = replace(options, job_id="again-2", replayed=other)
    env = orchestrator.run(staged, wrong, backend=fake)
    assert env.failure is not None and "inside the runner's own folder" in env.failure.reason
    # a link to the replayed folder is not that folder
    link = tmp_path / "state" / "jobs" / "link"
    link.symlink_to(root / "input")
    assert replace(options, replayed=link).input_rules().replayed is None
    right = replace(options, job_id="again-3", replayed=root / "input")
    assert orchestrator.run(staged, right, backend=fake).status == "succeeded"


def test_the_table_for_people() -> None:
    """The table a person reads, from a report: every run, each value, each file."""
    from runner.cli.replay import _table

    envelopes: list[ResultEnvelope | None] = [
        _envelope(SAME),
        _envelope({**SAME, "n": 11}, sha={"logs/count.txt": "9" * 64}),
    ]
    got, runs = _runs(envelopes)
    same, failed, text = summary(got, runs, 1, complete=True)
    report = ReplayReport(
        runnerVersion="0",
        jobId="j",
        jobDir="/x",
        contractDigest=DIGEST,
        signed=False,
        startedAt="t",
        finishedAt="t",
        times=1,
        complete=True,
        replays=["job-1"],
        runs=runs,
        failedReplays=failed,
        identical=same,
        measurements=got.measurements,
        evidence=got.evidence,
        firstDifference=got.first,
        summary=text,
    )
    table = _table(report)
    assert table.splitlines()[0] == text
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[2:] if line}
    assert rows["original"] == ["job-0", "succeeded"] and rows["1"] == ["job-1", "succeeded"]
    assert rows["acc"] == ["yes", "0.8,", "0.8", "0.0", "0"]
    assert rows["n"] == ["NO", "10,", "11", "1", "0.0952"]
    assert rows["logs/eval.json"] == ["yes"] and rows["logs/count.txt"] == ["NO", "1"]


def test_replays_the_host_refuses_are_failed_and_exit_as_refused(tmp_path: Path) -> None:
    """The host has the last word: an unsigned run replayed where unsigned contracts are no
    longer accepted fails each replay at its policy stage, and the command exits 3."""
    from runner.cli.replay import _exit

    fake = FakeBackend(jobs=FakeJob(work=_writer(lambda: '{"accuracy": 1}')))
    root, options = _original(tmp_path, fake)
    strict = replace(
        options,
        policy=policy.LoadedPolicy(policy.HostPolicy(acceptUnsigned=False).resolved(), "strict"),
    )
    report = replay.replay(replay.original(root, strict), strict, 2, backend=fake)
    assert report.failedReplays == [1, 2] and not report.identical and report.complete
    for run in report.runs[1:]:
        assert run.failure is not None and run.failure.stage == "policy"
        assert run.jobDir is None  # never a job: its reserved folder is gone
    assert not (root.parent / f"{root.name}-replay-1").exists()
    assert _exit(report) == 3
    assert "2 of 2 replays failed" in report.summary
    ok = replay.replay(replay.original(root, options), options, 1, backend=fake)
    assert _exit(ok) == 0


class _Interrupting:
    """Progress that is Ctrl-C at its first running tick."""

    def stage(self, name: str, detail: str) -> None:
        pass

    def running(self, elapsed: float, budget: float) -> None:
        raise KeyboardInterrupt

    def transfer(self, label: str, done: int, total: int) -> None:
        pass


def test_an_interrupted_replay_stops_the_rest_and_keeps_what_ran(tmp_path: Path) -> None:
    from runner.cli.replay import _exit

    fake = FakeBackend(
        jobs=lambda spec: FakeJob(
            seconds=math.inf if "replay-2" in spec.name else 0.0,
            work=_writer(lambda: '{"accuracy": 1}'),
        )
    )
    root, options = _original(tmp_path, fake)
    started: list[str] = []

    def on_start(n: int, job_id: str) -> Any:
        started.append(job_id)
        return _Interrupting()

    report = replay.replay(replay.original(root, options), options, 4, backend=fake,
                           on_start=on_start)  # fmt: skip
    assert started == [f"{root.name}-replay-1", f"{root.name}-replay-2"]  # 3 and 4 never ran
    assert not report.complete and report.finishedAt is None and not report.identical
    assert report.runs[1].status == "succeeded"
    assert report.runs[2].failure is not None and report.runs[2].failure.category == "cancelled"
    assert "2 of 4 replays ran so far" in report.summary
    written = ReplayReport.model_validate_json((root / "record" / "replays.json").read_bytes())
    assert written == report
    assert _exit(report) == 130
    assert fake.containers == {}
