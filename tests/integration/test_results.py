"""Evidence safety, the job's own result.json, re-grading and signed results."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from runner.app.regrade import EvidenceChanged, regrade
from runner.parsers import registry
from tests.support import json_measurement, run_cli, run_job, write_contract

pytestmark = pytest.mark.docker


def test_symlink_planted_by_the_job_is_refused(tmp_path: Path, image_id: str) -> None:
    """A job that plants metrics.json -> /etc/passwd gets parse_error naming the path."""
    plant = "import os; os.symlink('/etc/passwd', '/job/output/metrics.json')"
    contract = write_contract(
        tmp_path,
        image_id,
        command=["python3", "-c", plant],
        measurements=[json_measurement("metrics.json")],
    )
    code, env, _ = run_job(contract, tmp_path / "state")
    assert code == 1
    assert env["failure"]["category"] == "parse_error"
    assert "metrics.json" in env["failure"]["reason"]
    assert "outside" in env["failure"]["reason"]


def test_evidence_over_the_cap_is_not_read(tmp_path: Path, image_id: str) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"maxEvidenceMb": 0.00001}))
    contract = write_contract(tmp_path, image_id)
    code, env, _ = run_job(contract, tmp_path / "state", "--policy", str(policy))
    assert code == 1 and env["failure"]["category"] == "parse_error"
    assert "it was not read" in env["failure"]["reason"]


AGENT = r"""
import json, os
os.makedirs('/job/output/reports', exist_ok=True)
open('/job/output/reports/metrics.json', 'w').write(json.dumps({'accuracy': 0.9}))
json.dump({'schemaVersion': '2.0', 'status': 'completed', 'summary': 'ran the evaluation',
           'limitations': [], 'evidence': [
               {'path': 'reports/metrics.json', 'description': 'the metric'},
               {'path': LIE, 'description': 'claimed, never written'}]},
          open('/job/output/result.json', 'w'))
"""


@pytest.mark.parametrize("lie", [None, "reports/missing.json"])
def test_agent_result_is_embedded_and_checked(
    tmp_path: Path, image_id: str, lie: str | None
) -> None:
    """The job's result.json is the job's claim, validated; a file it lists that does not
    exist is flagged, and the runner's own verdict is unchanged."""
    code_text = AGENT.replace("LIE", repr(lie or "reports/metrics.json"))
    contract = write_contract(
        tmp_path,
        image_id,
        command=["python3", "-c", code_text],
        measurements=[json_measurement("reports/metrics.json")],
    )
    code, env, _ = run_job(contract, tmp_path / "state")
    assert code == 0 and env["status"] == "succeeded"
    record = env["agentResult"]
    assert record["claim"]["status"] == "completed"
    assert record["file"]["sha256"].startswith("sha256:")
    if lie is None:
        assert record["valid"] is True and record["problems"] == []
        assert record["listed"][0]["exists"] is True
    else:
        assert record["valid"] is False and record["problems"] == []
        assert record["flags"] == [
            {
                "code": "path_missing",
                "path": "$.evidence[1].path",
                "message": 'result.json lists "reports/missing.json", which does not exist',
            }
        ]
        assert any("not trustworthy" in w for w in env["warnings"])
    names = {log["path"] for log in env["logs"]}
    assert names == {"logs/evaluation.log", "logs/evaluation.err"}


CONTRACT_FORM = r"""
import json, os
os.makedirs('/job/output/reports', exist_ok=True)
open('/job/output/reports/metrics.json', 'w').write(json.dumps({'accuracy': 0.9}))
open('/job/output/reports/run.log', 'w').write('evaluated 1000 examples\n')
json.dump({'execution': {'status': 'failed', 'failure': None},
           'evidence': [{'path': 'reports/run.log', 'description': 'the run'}],
           'outputs': [{'id': 'acc', 'kind': 'table', 'role': 'primary',
                        'path': 'reports/metrics.json', 'description': 'the metric'}],
           'experiment': {'commands': ['python3 -c ...']},
           'diagnosis': '## Ran\nOnce.', 'workloadCompletion': []},
          open('/job/output/result.json', 'w'))
"""


def test_result_json_inconsistencies_are_flagged_in_the_envelope(
    tmp_path: Path, image_id: str
) -> None:
    """A job whose execute-contract result.json leaves its parser input out of evidence and
    says failed without a failure: each is a flag in the envelope `runner run --json` prints
    (and stores), and so is its disagreement with the runner's verdict; the measurement is the
    parser's, whatever result.json says."""
    contract = write_contract(
        tmp_path,
        image_id,
        command=["python3", "-c", CONTRACT_FORM],
        measurements=[json_measurement("reports/metrics.json")],
    )
    code, env, _ = run_job(contract, tmp_path / "state")
    assert code == 0 and env["status"] == "succeeded"
    assert [m["value"] for m in env["measurements"]] == [0.9]
    record = env["agentResult"]
    assert record["valid"] is False and record["problems"] == []
    assert record["claim"]["execution"] == {"status": "failed", "failure": None}
    assert [(f["code"], f["path"]) for f in record["flags"]] == [
        ("failure_missing", "$.execution.failure"),
        ("parser_input_not_in_evidence", "$.evidence"),
        ("claim_contradicts_runner", "$.execution.status"),
    ]
    assert "reports/metrics.json" in record["flags"][1]["message"]
    assert {f["path"] for f in record["listed"]} == {"reports/run.log", "reports/metrics.json"}
    assert any("not trustworthy" in w and "failure_missing" in w for w in env["warnings"])
    stored = json.loads((Path(env["jobDir"]) / "result.json").read_text())
    assert stored["agentResult"]["flags"] == record["flags"]


class _TimesHundred:
    id = "json.scalar"
    version = "2"
    description = "test-only: version 1 times 100"
    config_schema = registry.get("json.scalar", "1").config_schema

    def parse(self, evidence: Path, config: dict[str, Any]) -> float:
        value = registry.get("json.scalar", "1").parse(evidence, config)
        assert isinstance(value, float)
        return value * 100


def test_regrading_uses_the_recorded_parser_version(tmp_path: Path, image_id: str) -> None:
    """After a parser change, `runner parse` reproduces the recorded values with the recorded
    version; --latest uses the new version and says so; changed evidence is refused."""
    contract = write_contract(tmp_path, image_id)
    code, env, _ = run_job(contract, tmp_path / "state")
    assert code == 0
    job = Path(env["jobDir"])
    registry.register(_TimesHundred())
    try:
        again = regrade(job, latest=False, max_bytes=2**30, result_key=None)
        assert again.revision == 2 and again.regrade is not None
        assert again.regrade.parserVersions == "recorded" and again.regrade.changes == []
        assert [m.value for m in again.measurements] == [0.819]
        assert again.measurements[0].parser.version == "1"
        latest = regrade(job, latest=True, max_bytes=2**30, result_key=None)
        assert latest.measurements[0].value == pytest.approx(81.9)
        assert latest.regrade is not None
        assert latest.regrade.changes == ["toy-accuracy: json.scalar version 1 -> 2"]
        assert len(list((job / "record").glob("result-*.json"))) == 2
    finally:
        registry._REGISTRY.parsers.pop(("json.scalar", "2"))
    evidence = job / "output" / "logs" / "evaluation.log"
    evidence.write_text(evidence.read_text().replace("0.819", "0.999"))
    with pytest.raises(EvidenceChanged, match="now hashes to"):
        regrade(job, latest=False, max_bytes=2**30, result_key=None)


def test_signed_result_verifies_and_catches_tampering(tmp_path: Path, image_id: str) -> None:
    """result.intoto.json verifies with the runner's key and the output folder; one changed
    byte of evidence, a changed value, or an untrusted key is caught."""
    contract = write_contract(tmp_path, image_id)
    code, env, _ = run_job(contract, tmp_path / "state")
    assert code == 0
    job = Path(env["jobDir"])
    statement = job / "result.intoto.json"
    import os

    runner_pub = Path(os.environ["RUNNER_CONFIG_DIR"]) / "runner-key" / "runner.pub"
    trusted = tmp_path / "trusted-runner-keys"
    assert run_cli("trust", str(runner_pub), "--result-keys", str(trusted)).returncode == 0
    args = ["--result-keys", str(trusted), "--json"]
    ok = run_cli("verify-result", str(statement), "--output-dir", str(job / "output"), *args)
    assert ok.returncode == 0, ok.stderr
    info = json.loads(ok.stdout)
    assert info["measurements"] == {"toy-accuracy": 0.819}
    assert info["subjectsChecked"] == info["subjects"] >= 2

    # A changed value inside the signed envelope statement.
    signed = job / "result.envelope.intoto.json"
    dsse = json.loads(signed.read_text())
    payload = base64.b64decode(dsse["payload"]).replace(b"0.819", b"0.919")
    signed.write_text(json.dumps({**dsse, "payload": base64.b64encode(payload).decode()}))
    bad = run_cli("verify-result", str(job), *args)
    assert bad.returncode == 3 and "signature_invalid" in bad.stderr
    signed.write_text(json.dumps(dsse))

    # A changed value in result.json, which the provenance signs by digest.
    envelope = job / "result.json"
    original = envelope.read_text()
    envelope.write_text(original.replace("0.819", "0.919"))
    bad = run_cli("verify-result", str(job), *args)
    assert bad.returncode == 3 and "is not the result.json that" in bad.stderr
    envelope.write_text(original)

    # An untrusted key.
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = run_cli("verify-result", str(statement), "--result-keys", str(empty))
    assert bad.returncode == 3 and "no trusted keys" in bad.stderr

    # One byte of evidence.
    evidence = job / "output" / "logs" / "evaluation.log"
    data = bytearray(evidence.read_bytes())
    data[2] ^= 1
    evidence.write_bytes(bytes(data))
    bad = run_cli("verify-result", str(statement), "--output-dir", str(job / "output"), *args)
    assert bad.returncode == 3
    assert "logs/evaluation.log: sha256" in bad.stderr
