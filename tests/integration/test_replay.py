"""`runner replay` with the real engine: the signed toy evaluation replayed is identical, value and
evidence bytes; a job that reads /dev/urandom into its evidence and the clock into a value
differs, and the first difference is named in the contract's order. The comparison's cases
and the replays' bookkeeping on the fake backend: tests/unit/test_replay.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.models.replay import ReplayLink, ReplayReport
from tests.support import (
    SESSION_ID,
    SESSION_LABEL,
    json_measurement,
    run_cli,
    run_job,
    session_containers,
    write_contract,
)

pytestmark = pytest.mark.docker

LABEL = ["--label", f"{SESSION_LABEL}={SESSION_ID}"]


def _replay(job: Path, *extra: str) -> tuple[int, ReplayReport, str]:
    proc = run_cli("replay", str(job), "--times", "2", "--json", *LABEL, *extra)
    try:
        report = ReplayReport.model_validate_json(proc.stdout)
    except ValueError:
        pytest.fail(f"stdout is not one report:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc.returncode, report, proc.stderr


def test_the_signed_toy_replayed_is_identical(tmp_path: Path, image_id: str) -> None:
    keys, policy = tmp_path / "trusted", tmp_path / "policy.json"
    policy.write_text(json.dumps({"allowJobIdOverride": True}))
    assert run_cli("key", "new", "--out", str(tmp_path / "issuer")).returncode == 0
    trusted = run_cli("key", "trust", str(tmp_path / "issuer.pub"), "--trusted-keys", str(keys))
    assert trusted.returncode == 0, trusted.stderr
    contract = write_contract(tmp_path, image_id)
    signed = run_cli("contract", "sign", str(contract), "--key", str(tmp_path / "issuer.key"),
                     "--json")  # fmt: skip
    assert signed.returncode == 0, signed.stderr
    host = ["--trusted-keys", str(keys), "--policy", str(policy)]
    code, env, stderr = run_job(
        Path(json.loads(signed.stdout)["envelope"]), tmp_path / "state", *host, unsigned=False
    )
    assert code == 0 and env["signature"]["status"] == "verified", stderr
    job = Path(env["jobDir"])

    code, report, stderr = _replay(job, *host)
    assert code == 0, (report.summary, stderr)
    assert report.identical and report.complete and report.signed
    assert report.failedReplays == [] and report.firstDifference is None
    (m,) = report.measurements
    assert [v.value for v in m.values] == [0.819, 0.819, 0.819]
    assert (m.range, m.relativeSpread) == (0.0, 0.0)
    (e,) = report.evidence
    assert e.path == "logs/evaluation.log" and e.identical
    assert len({h.sha256 for h in e.hashes}) == 1 and e.hashes[0].sha256 is not None
    assert "[1/2]" in stderr and "[2/2]" in stderr  # progress on stderr
    # the report where `runner report` finds it, naming the replays' jobs
    written = ReplayReport.model_validate_json((job / "record" / "replays.json").read_bytes())
    assert written == report
    assert report.replays == [f"{job.name}-replay-1", f"{job.name}-replay-2"]
    for n, run in enumerate(report.runs[1:], 1):
        folder = Path(str(run.jobDir))
        assert folder.parent == job.parent and folder.name == report.replays[n - 1]
        link = ReplayLink.model_validate_json((folder / "record" / "replay-of.json").read_bytes())
        assert link.replayOf == job.name and link.run == n
        replayed: dict[str, Any] = json.loads((folder / "result.json").read_text())
        assert replayed["signature"]["status"] == "verified"  # verified again, by this host
        assert replayed["contractDigest"] == env["contractDigest"]
        assert replayed["budget"]["attempts"] == 1  # a budget of its own
    assert session_containers() == []


NOISY = """
import json, os, time
os.makedirs("/job/output/logs", exist_ok=True)
def put(name, data):
    with open(f"/job/output/logs/{name}", "w") as f:
        json.dump(data, f)
put("stable.json", {"accuracy": 0.5})
put("noisy.json", {"accuracy": 0.5, "noise": os.urandom(16).hex()})
put("clock.json", {"accuracy": time.time_ns()})
"""


def test_a_job_that_reads_urandom_and_the_clock_differs(tmp_path: Path, image_id: str) -> None:
    contract = write_contract(
        tmp_path,
        image_id,
        command=["python3", "-c", NOISY],
        measurements=[
            json_measurement("logs/stable.json", mid="stable"),
            json_measurement("logs/noisy.json", mid="noisy"),
            json_measurement("logs/clock.json", mid="clock", metric="time"),
        ],
    )
    code, env, stderr = run_job(contract, tmp_path / "state")
    assert code == 0, stderr
    job = Path(env["jobDir"])

    code, report, stderr = _replay(job, "--allow-unsigned")
    assert code == 1, (report.summary, stderr)  # it ran, and differs
    assert not report.identical and report.complete and report.failedReplays == []
    stable, noisy, clock = report.measurements
    assert stable.identical and noisy.identical  # the same values ...
    assert not clock.identical and clock.firstDifferentRun == 1
    assert isinstance(clock.range, int) and clock.range > 0  # ns since the epoch: exact
    files = {e.path: e for e in report.evidence}
    assert files["logs/stable.json"].identical
    assert not files["logs/noisy.json"].identical  # ... but not the same bytes
    assert not files["logs/clock.json"].identical
    # first in the contract's order: stable, its file, noisy, then noisy's file
    first = report.firstDifference
    assert first is not None
    assert (first.kind, first.path, first.run) == ("evidence", "logs/noisy.json", 1)
    assert first.jobId == f"{job.name}-replay-1"
    assert "logs/noisy.json" in report.summary
    # people get a table (stdout) naming what differs
    table = run_cli("replay", str(job), "--times", "1", *LABEL, "--allow-unsigned")
    assert table.returncode == 1, table.stderr
    assert "clock" in table.stdout and "NO" in table.stdout
    again = ReplayReport.model_validate_json((job / "record" / "replays.json").read_bytes())
    assert again.replays == [f"{job.name}-replay-3"] and again.earlierReplays == report.replays
    assert session_containers() == []
