"""The job's self-report (result.json), checked against the contract, its files and the
runner's verdict: every inconsistency is a flag (pure: an output folder in tmp, no engine)."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from runner.app.schemas import CONTRACTS
from runner.evidence import selfreport
from runner.models.envelope import AgentResultRecord
from runner.models.selfreport import rendered_schema, schema_bytes

CONTRACT: dict[str, Any] = {
    "measurements": [
        {
            "measurementId": "acc",
            "parser": {"id": "json.scalar", "version": "1", "evidencePath": "metrics/acc.json"},
        }
    ],
    "protocol": {
        "preflight": {
            "evidencePath": "preflight.json",
            "checks": [{"id": "runtime"}, {"id": "dataset_loader"}],
        },
        "workload": {"groups": [{"groupId": "eval"}]},
    },
}

GOOD: dict[str, Any] = {
    "schemaVersion": "2.0",
    "status": "completed",
    "summary": "Evaluated the checkpoint on the full test split.",
    "limitations": [],
    "execution": {"status": "succeeded", "failure": None},
    "preflight": {
        "source": "agent",
        "evidencePath": "preflight.json",
        "checks": [
            {"id": "runtime", "status": "passed"},
            {"id": "dataset_loader", "status": "passed"},
        ],
    },
    "evidence": [
        {"path": "metrics/acc.json", "description": "parser input"},
        {"path": "preflight.json", "description": "preflight outcomes"},
        {"path": "raw/eval.csv", "description": "one row per evaluated unit"},
    ],
    "outputs": [
        {
            "id": "model",
            "kind": "model",
            "role": "primary",
            "path": "model",
            "description": "the evaluated weights",
            "relatedEvidencePaths": ["logs/run.log"],
            "scientificObjectId": "obj-model",
        }
    ],
    "experiment": {"commands": ["python evaluate.py --checkpoint model"]},
    "codeChanges": [{"path": "runtime-venv/lib/fix.py", "kind": "environment"}],
    "diagnosis": "## What happened\nThe evaluation ran once, on CPU.",
    "workloadCompletion": [{"groupId": "eval", "units": 3, "evidencePath": "raw/eval.csv"}],
    "notInTheSeed": {"kept": True},
}

SHORT: dict[str, Any] = {
    "schemaVersion": "2.0",
    "status": "completed",
    "summary": "What ran, what it showed.",
    "limitations": [],
    "evidence": [{"path": "logs/run.log", "description": "the run"}],
}


def _output(tmp_path: Path, result: Any) -> Path:
    out = tmp_path / "output"
    for rel, text in {
        "metrics/acc.json": '{"accuracy": 0.8}',
        "preflight.json": "{}",
        "raw/eval.csv": "unit,ok\n1,1\n2,1\n3,1\n",
        "logs/run.log": "ran\n",
        "model/weights.bin": "w",
    }.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    os.symlink("/etc/passwd", out / "passwd.json")
    os.symlink("/etc", out / "etc")
    os.mkfifo(out / "pipe.json")
    raw = result if isinstance(result, str) else json.dumps(result)
    (out / "result.json").write_text(raw)
    return out


def _read(
    tmp_path: Path,
    result: Any,
    verdict: str | None = "succeeded",
    contract: dict[str, Any] | None = CONTRACT,
) -> AgentResultRecord:
    record = selfreport.read(
        _output(tmp_path, result), 2**30, 2**20, contract=contract, verdict=verdict
    )
    assert record is not None
    return record


def _flags(record: AgentResultRecord) -> set[tuple[str, str]]:
    return {(f.code, f.path) for f in record.flags}


def test_a_consistent_contract_result_has_no_flag(tmp_path: Path) -> None:
    record = _read(tmp_path, GOOD)
    assert record.flags == [] and record.problems == [] and record.valid is True
    assert record.claim == GOOD  # as written, fields beyond the seed's included
    listed = {f.path: f for f in record.listed}
    assert set(listed) == {
        "metrics/acc.json",
        "preflight.json",
        "raw/eval.csv",
        "model",
        "logs/run.log",
    }
    assert listed["model"].exists and listed["model"].sha256 is None  # a folder, not hashed
    assert all(f.sha256 for p, f in listed.items() if p != "model")
    assert selfreport.warning(record) is None


def test_a_consistent_short_result_has_no_flag(tmp_path: Path) -> None:
    """The short summary lists no parser input and no preflight: that is no disagreement."""
    record = _read(tmp_path, SHORT)
    assert record.valid is True and record.flags == []
    failed = {**SHORT, "status": "failed", "summary": "the loader broke"}
    assert _read(tmp_path / "f", failed, verdict="failed").flags == []


def test_an_honest_failure_has_no_flag(tmp_path: Path) -> None:
    """Failed with a reason, a failed preflight check and no workload entry: consistent."""
    result = copy.deepcopy(GOOD)
    result["status"] = "failed"
    result["execution"] = {
        "status": "failed",
        "failure": {
            "category": "protocol_ambiguous",
            "stage": "preflight",
            "retryable": False,
            "reason": "the split is not named",
        },
    }
    result["preflight"]["checks"][1]["status"] = "failed"
    result["workloadCompletion"] = []
    assert _read(tmp_path, result, verdict="failed").flags == []


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        *head, last = path.split(".")
        at: Any = data
        for key in head:
            at = at[int(key)] if key.isdigit() else at[key]
        if value is _DELETE:
            del at[int(last) if last.isdigit() else last]
        elif last.isdigit():
            at[int(last)] = value
        else:
            at[last] = value

    return change


def _add(path: str, item: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data[path].append(item)

    return change


_DELETE = object()

FAILURE = {"category": "timeout", "stage": "run", "retryable": False, "reason": "too slow"}

CASES: list[tuple[str, Callable[[dict[str, Any]], None], str, set[tuple[str, str]]]] = [
    (
        "succeeded with a failed preflight check",
        _set("preflight.checks.1.status", "failed"),
        "succeeded",
        {("preflight_not_passed_but_succeeded", "$.preflight.checks[1]")},
    ),
    (
        "succeeded with a preflight check without an outcome",
        _set("preflight.checks.1", {"id": "dataset_loader"}),
        "succeeded",
        {("preflight_not_passed_but_succeeded", "$.preflight.checks[1]")},
    ),
    (
        "a contract check id missing",
        _set("preflight.checks.1", _DELETE),
        "succeeded",
        {("preflight_check_missing", "$.preflight.checks")},
    ),
    (
        "a contract check id missing, checks as an object",
        _set("preflight.checks", {"runtime": "passed"}),
        "succeeded",
        {("preflight_check_missing", "$.preflight.checks")},
    ),
    (
        "a failed check, checks as an object",
        _set("preflight.checks", {"runtime": "passed", "dataset_loader": {"outcome": "fail"}}),
        "succeeded",
        {("preflight_not_passed_but_succeeded", "$.preflight.checks.dataset_loader")},
    ),
    (
        "no preflight though the contract declares one",
        _set("preflight", _DELETE),
        "succeeded",
        {("preflight_missing", "$.preflight")},
    ),
    (
        "preflight not by the agent",
        _set("preflight.source", "runner"),
        "succeeded",
        {("preflight_source_not_agent", "$.preflight.source")},
    ),
    (
        "another preflight evidence path",
        _set("preflight.evidencePath", "logs/run.log"),
        "succeeded",
        {("preflight_evidence_path_mismatch", "$.preflight.evidencePath")},
    ),
    (
        "a parser input not listed in evidence",
        _set("evidence.0", _DELETE),
        "succeeded",
        {("parser_input_not_in_evidence", "$.evidence")},
    ),
    (
        "a listed evidence file that does not exist",
        _add("evidence", {"path": "missing.json"}),
        "succeeded",
        {("path_missing", "$.evidence[3].path")},
    ),
    (
        "an output that does not exist",
        _add("outputs", {"path": "figures/f.png", "kind": "figure"}),
        "succeeded",
        {("path_missing", "$.outputs[1].path")},
    ),
    (
        "related evidence that does not exist",
        _set("outputs.0.relatedEvidencePaths", ["logs/gone.log"]),
        "succeeded",
        {("path_missing", "$.outputs[0].relatedEvidencePaths[0]")},
    ),
    (
        "an absolute evidence path",
        _add("evidence", {"path": "/etc/passwd"}),
        "succeeded",
        {("path_outside_output", "$.evidence[3].path")},
    ),
    (
        "an evidence path with ..",
        _add("evidence", {"path": "logs/../../task.json"}),
        "succeeded",
        {("path_outside_output", "$.evidence[3].path")},
    ),
    (
        "an evidence file that is a link out",
        _add("evidence", {"path": "passwd.json"}),
        "succeeded",
        {("path_outside_output", "$.evidence[3].path")},
    ),
    (
        "an evidence path through a linked folder",
        _add("evidence", {"path": "etc/passwd"}),
        "succeeded",
        {("path_outside_output", "$.evidence[3].path")},
    ),
    (
        "an evidence FIFO",
        _add("evidence", {"path": "pipe.json"}),
        "succeeded",
        {("path_unreadable", "$.evidence[3].path")},
    ),
    (
        "succeeded with a failure",
        _set("execution.failure", FAILURE),
        "succeeded",
        {("failure_with_success", "$.execution.failure")},
    ),
    (
        "partial without a failure",
        lambda d: d.update(status="partial", execution={"status": "partial", "failure": None}),
        "partial",
        {("failure_missing", "$.execution.failure")},
    ),
    (
        "top-level status and execution.status disagree",
        _set("status", "failed"),
        "succeeded",
        {("status_disagrees", "$.status")},
    ),
    (
        "a workload group twice",
        _add("workloadCompletion", {"groupId": "eval", "units": 1, "evidencePath": "raw/eval.csv"}),
        "succeeded",
        {("workload_group_duplicate", "$.workloadCompletion[1].groupId")},
    ),
    (
        "a workload group the contract does not declare",
        _add(
            "workloadCompletion", {"groupId": "train", "units": 1, "evidencePath": "raw/eval.csv"}
        ),
        "succeeded",
        {("workload_group_unknown", "$.workloadCompletion[1].groupId")},
    ),
    (
        "succeeded with a workload group missing",
        _set("workloadCompletion", []),
        "succeeded",
        {("workload_group_missing", "$.workloadCompletion")},
    ),
    (
        "workload evidence not listed in evidence",
        _set("workloadCompletion.0.evidencePath", "logs/run.log"),
        "succeeded",
        {("workload_evidence_not_in_evidence", "$.workloadCompletion[0].evidencePath")},
    ),
    (
        "workload evidence that does not exist",
        _set("workloadCompletion.0.evidencePath", "raw/gone.csv"),
        "succeeded",
        {
            ("path_missing", "$.workloadCompletion[0].evidencePath"),
            ("workload_evidence_not_in_evidence", "$.workloadCompletion[0].evidencePath"),
        },
    ),
    (
        "workload without evidence",
        _set("workloadCompletion.0.evidencePath", _DELETE),
        "succeeded",
        {("workload_evidence_missing", "$.workloadCompletion[0]")},
    ),
    (
        "an absolute code change path",
        _set("codeChanges.0.path", "/job/runtime-venv/lib/fix.py"),
        "succeeded",
        {("code_change_path_unsafe", "$.codeChanges[0].path")},
    ),
    (
        "the job says succeeded, the runner does not",
        lambda d: None,
        "partial",
        {("claim_contradicts_runner", "$.execution.status")},
    ),
]


@pytest.mark.parametrize(
    ("change", "verdict", "expected"),
    [pytest.param(c, v, e, id=name) for name, c, v, e in CASES],
)
def test_each_inconsistency_is_flagged(
    tmp_path: Path,
    change: Callable[[dict[str, Any]], None],
    verdict: str,
    expected: set[tuple[str, str]],
) -> None:
    """Each change to the consistent result raises exactly its own flags; the result is still
    kept (the claim, the listed files), never rejected."""
    result = copy.deepcopy(GOOD)
    change(result)
    record = _read(tmp_path, result, verdict=verdict)
    assert _flags(record) == expected, record.flags
    assert record.valid is False and record.problems == []
    assert record.claim == result
    assert all(f.code in selfreport.FLAGS for f in record.flags)
    said = selfreport.warning(record)
    assert said is not None and "not trustworthy" in said


@pytest.mark.parametrize(("status", "verdict"), [("completed", "failed"), ("partial", "succeeded")])
def test_the_short_form_against_the_runners_verdict(
    tmp_path: Path, status: str, verdict: str
) -> None:
    record = _read(tmp_path, {**SHORT, "status": status}, verdict=verdict)
    assert _flags(record) == {("claim_contradicts_runner", "$.status")}
    assert f"the job says {status}; the runner's status is {verdict}" in record.flags[0].message


def test_the_contract_may_list_checks_and_groups(tmp_path: Path) -> None:
    """protocol.preflight and protocol.workload read as lists (ids as id or checkId)."""
    contract = copy.deepcopy(CONTRACT)
    contract["protocol"] = {
        "preflight": [{"checkId": "runtime"}, {"checkId": "gpu"}],
        "workload": [{"id": "eval"}, {"id": "train"}],
    }
    flags = _flags(_read(tmp_path, GOOD, contract=contract))
    assert flags == {
        ("preflight_check_missing", "$.preflight.checks"),
        ("workload_group_missing", "$.workloadCompletion"),
    }


def test_without_a_contract_or_verdict_only_its_own_consistency(tmp_path: Path) -> None:
    result = copy.deepcopy(GOOD)
    del result["preflight"], result["evidence"][0]
    result["execution"]["failure"] = FAILURE
    record = _read(tmp_path, result, verdict=None, contract=None)
    assert _flags(record) == {("failure_with_success", "$.execution.failure")}


def test_a_path_is_flagged_once_and_flags_are_capped(tmp_path: Path) -> None:
    result = copy.deepcopy(GOOD)
    result["evidence"] += [{"path": "missing.json"}] * 2
    result["evidence"] += [{"path": f"gone/{i}.json"} for i in range(300)]
    record = _read(tmp_path, result)
    assert len(record.flags) == selfreport.MAX_FLAGS
    assert [f.path for f in record.flags[:2]] == ["$.evidence[3].path", "$.evidence[5].path"]
    assert record.problems == [f"101 more flags than the {selfreport.MAX_FLAGS} recorded"]


def test_job_text_in_a_message_is_quoted_and_cut(tmp_path: Path) -> None:
    result = copy.deepcopy(GOOD)
    result["preflight"]["source"] = "\x1b[31m" + "x" * 5000
    (flag,) = _read(tmp_path, result).flags
    assert "\x1b" not in flag.message and len(flag.message) < 300


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("{not json", "result.json is not JSON"),
        ("[1, 2]", "result.json $: Input should be a valid dictionary"),
        (json.dumps({**SHORT, "summary": None}), "result.json $.summary: Input should be"),
        (
            json.dumps({**GOOD, "execution": {"status": "done"}}),
            "result.json $.execution.status: Input should be 'succeeded', 'failed' or 'partial'",
        ),
        (
            json.dumps({**GOOD, "outputs": [{"path": "model", "kind": "weights"}]}),
            "result.json $.outputs[0].kind: Input should be",
        ),
    ],
)
def test_unreadable_or_wrong_shape_is_a_problem_not_a_crash(
    tmp_path: Path, raw: str, problem: str
) -> None:
    record = _read(tmp_path, raw)
    assert record.valid is False and record.claim is None and record.flags == []
    assert any(p.startswith(problem) for p in record.problems), record.problems


def test_the_schema_staged_for_the_job_is_the_checked_in_one() -> None:
    """schema_bytes() (the copy shipped in the package, read instead of generated) is what the
    models generate now and is contracts/agent-result.schema.json; both seed shapes match
    exactly one of its branches, and a document that is neither matches none."""
    data = schema_bytes()
    assert data == rendered_schema()  # a model changed: `python -m runner.app.schemas`
    assert data == (CONTRACTS / "agent-result.schema.json").read_bytes()
    schema = json.loads(data)
    assert "/job/input/result.schema.json" in schema["description"]
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for good in (GOOD, SHORT, {"execution": {"status": "failed", "failure": FAILURE}}):
        validator.validate(good)
    for bad in (
        {**SHORT, "status": "succeeded"},
        {"execution": {"status": "succeeded"}, "outputs": [{"path": "x", "kind": "weights"}]},
        {"summary": "no version"},
    ):
        assert not validator.is_valid(bad), bad
