"""The platform's contracts as they are issued: the seed's vocabulary, the execution mode, the
/job layout the job expects, and every attempt's evidence kept (issue 14).

The tests that need no engine are in tests/unit/test_platform_contracts.py."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import (
    TOY,
    json_measurement,
    run_cli,
    run_job,
    session_containers,
    start_job,
    wait_running,
    write_contract,
)
from tests.unit.test_platform_contracts import (
    every_seed_field,
)

LAYOUT_SCRIPT = r"""
set -e
cp /job/input/task.json /job/output/task-seen.json
echo "# edited" >> /job/workspace/repository/evaluate.py
echo installed > /job/runtime-venv/pkg.txt
echo cached > /job/runtime-cache/c.txt
test "$XDG_CACHE_HOME" = /job/runtime-cache
if (echo x > /job/assets/x) 2>/dev/null; then echo "assets writable"; exit 9; fi
if (echo x > /job/input/repository/x) 2>/dev/null; then echo "input writable"; exit 10; fi
python3 - <<'EOF'
import json
d = json.load(open("/job/input/compute-decision.json"))
assert d["accelerator"] == "cpu" and d["gpus"] == [] and d["network"] == "none", d
assert d["attempt"] == 1 and d["budgetLimitSeconds"] == 120, d
schema = json.load(open("/job/input/result.schema.json"))
assert schema["title"] == "The job's own result.json", schema
EOF
python3 /job/workspace/repository/evaluate.py --checkpoint /job/input/repository/checkpoint.json
"""


@pytest.mark.docker
def test_the_job_layout_and_the_contract_bytes_reach_the_job(tmp_path: Path, image_id: str) -> None:
    contract = write_contract(
        tmp_path,
        image_id,
        command=["sh", "-c", LAYOUT_SCRIPT],
        environment={"timeoutMinutes": 2},
        change=every_seed_field,
    )
    code, envelope, err = run_job(contract, tmp_path / "state")
    assert code == 0, (envelope, err)
    assert envelope["measurements"][0]["value"] == 0.819
    job = tmp_path / "state" / "jobs" / envelope["jobId"]
    # byte for byte: the contract as issued, every seed field included
    assert (job / "output" / "task-seen.json").read_bytes() == contract.read_bytes()
    # the pristine repository is untouched; the working copy has the job's edit
    pristine = (TOY / "repository" / "evaluate.py").read_bytes()
    assert (job / "input" / "repository" / "evaluate.py").read_bytes() == pristine
    edited = (job / "workspace" / "repository" / "evaluate.py").read_bytes()
    assert edited == pristine + b"# edited\n"
    assert (job / "runtime-venv" / "pkg.txt").read_text() == "installed\n"
    assert (job / "runtime-cache" / "c.txt").read_text() == "cached\n"
    assert list((job / "assets").iterdir()) == []
    decided = json.loads((job / "input" / "compute-decision.json").read_bytes())
    assert envelope["allocation"] == decided
    assert envelope["research"] == json.loads(contract.read_text())["research"]
    names = {m["name"]: m for m in envelope["materials"]}
    assert set(names) == {
        "contract:toy-checkpoint-evaluation",
        "input/paper.md",
        "input/repository",
        f"image:{image_id}",
    }
    assert names[f"image:{image_id}"]["digest"]["sha256"] == image_id.removeprefix("sha256:")
    repo = next(i for i in envelope["inputs"] if i["field"] == "$.repository.path")
    assert names["input/repository"]["digest"]["sha256"] == repo["digest"].removeprefix("sha256:")
    manifest = json.loads((job / "execution" / "input-manifest.json").read_text())
    listed = {f["path"] for f in manifest["files"]}
    assert {"compute-decision.json", "result.schema.json", "task.json"} <= listed


ATTEMPTS_SCRIPT = r"""
mkdir -p /job/output/out
echo "stdout of attempt $RUNNER_ATTEMPT"
echo "stderr of attempt $RUNNER_ATTEMPT" >&2
if [ "$RUNNER_ATTEMPT" = 1 ]; then
  echo '{"accuracy": 0.5}' > /job/output/out/first.json
  echo kept > /job/runtime-venv/marker
  sleep 300
fi
test "$(cat /job/runtime-venv/marker)" = kept || exit 7
echo '{"accuracy": 0.819}' > /job/output/out/second.json
"""


@pytest.mark.docker
def test_every_attempt_keeps_its_evidence(tmp_path: Path, image_id: str) -> None:
    contract = write_contract(
        tmp_path,
        image_id,
        command=["sh", "-c", ATTEMPTS_SCRIPT],
        protocol={"stdoutPath": "logs/out.log", "stderrPath": "logs/err.log"},
        measurements=[
            json_measurement("out/first.json", mid="first"),
            json_measurement("out/second.json", mid="second"),
        ],
        environment={"timeoutMinutes": 5},
    )
    state = tmp_path / "state"
    proc = start_job(contract, state)
    try:
        wait_running(proc)
        deadline = time.monotonic() + 60
        while not list(state.glob("jobs/*/output/out/first.json")):
            assert time.monotonic() < deadline, "attempt 1 never wrote its file"
            time.sleep(0.2)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    first = json.loads(out)
    assert first["failure"]["category"] == "cancelled"
    job = state / "jobs" / first["jobId"]
    streams_1 = (job / "output" / "logs" / "out.log").read_bytes()
    assert streams_1 == b"stdout of attempt 1\n"

    code, envelope, err = run_job(contract, state)
    assert code == 0, (envelope, err)
    assert envelope["attempt"] == 2
    # attempt 1's stdout and stderr moved to its record, byte for byte; attempt 2's in place
    kept = job / "record" / "attempts" / "1" / "streams" / "logs"
    assert (kept / "out.log").read_bytes() == streams_1
    assert (kept / "err.log").read_bytes() == b"stderr of attempt 1\n"
    assert (job / "output" / "logs" / "out.log").read_bytes() == b"stdout of attempt 2\n"
    for n in (1, 2):
        assert (job / "record" / "attempts" / str(n) / "container-state.json").is_file()
    # the envelope says which attempt wrote each evidence file
    by_id = {m["measurementId"]: m for m in envelope["measurements"]}
    assert by_id["first"]["evidence"]["attempt"] == 1
    assert by_id["second"]["evidence"]["attempt"] == 2
    assert {log["path"]: log["attempt"] for log in envelope["logs"]} == {
        "logs/out.log": 2,
        "logs/err.log": 2,
    }
    records = {a["attempt"]: a for a in envelope["attempts"]}
    assert records[1]["classification"] == "cancelled"
    assert records[2]["classification"] == "succeeded"
    files_1 = {f["path"] for f in records[1]["files"]}
    assert "record/attempts/1/streams/logs/out.log" in files_1
    assert envelope["allocation"]["attempt"] == 2
    assert not session_containers()
    # a re-grade reads the same bytes and keeps which attempt wrote them
    proc = run_cli("parse", envelope["jobId"], "--state-dir", str(state), "--json")
    assert proc.returncode == 0, proc.stderr
    again = json.loads(proc.stdout)
    assert again["revision"] == 2
    assert [m["evidence"] for m in again["measurements"]] == [
        m["evidence"] for m in envelope["measurements"]
    ]


PREFLIGHT_SCRIPT = r"""
python3 /job/input/repository/evaluate.py --checkpoint /job/input/repository/checkpoint.json \
  > /job/output/logs/evaluation.log
python3 - <<'EOF'
import json
result = {
    "schemaVersion": "2.0",
    "status": "completed",
    "summary": "evaluated",
    "execution": {"status": "succeeded", "failure": None},
    "preflight": {
        "source": "agent",
        "evidencePath": "preflight.json",
        "checks": [{"id": "runtime", "status": "failed"}],
    },
    "evidence": [{"path": "logs/evaluation.log"}],
    "workloadCompletion": [],
}
json.dump({"runtime": "failed"}, open("/job/output/preflight.json", "w"))
json.dump(result, open("/job/output/result.json", "w"))
EOF
"""


@pytest.mark.docker
def test_the_contracts_preflight_and_workload_are_checked_against_result_json(
    tmp_path: Path, image_id: str
) -> None:
    """Succeeded while a declared preflight check failed, another check id missing and a
    declared workload group unreported: each is a flag, the parsers' value stands."""

    def declare(data: dict[str, Any]) -> None:
        data["protocol"]["preflight"] = {
            "evidencePath": "preflight.json",
            "checks": [{"id": "runtime"}, {"id": "checkpoint"}],
        }
        data["protocol"]["workload"] = {"groups": [{"groupId": "evaluation", "units": 1}]}

    contract = write_contract(
        tmp_path, image_id, command=["sh", "-c", PREFLIGHT_SCRIPT], change=declare
    )
    code, envelope, err = run_job(contract, tmp_path / "state")
    assert code == 0, (envelope, err)
    assert envelope["measurements"][0]["value"] == 0.819
    codes = {f["code"] for f in envelope["agentResult"]["flags"]}
    assert {
        "preflight_not_passed_but_succeeded",
        "preflight_check_missing",
        "workload_group_missing",
    } <= codes, codes
    assert not envelope["agentResult"]["valid"]
