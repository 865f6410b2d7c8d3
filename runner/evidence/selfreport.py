"""Long on purpose: every check the runner makes of the job's self-report against the
contract, the job's files and its own verdict, with the flag codes they raise, in one place.

The job's self-report, ``/job/output/result.json``, is validated against its models
(:mod:`runner.models.selfreport`, its two shapes) and never trusted.

:func:`read` checks that the files it lists exist inside the output folder and hashes them,
checks it against the contract (preflight check ids, parser inputs, workload groups) and the
runner's verdict, and records every disagreement as a flag (:data:`FLAGS`); nothing in it can
fail the run, and its numbers are never taken as measurements.
"""

from __future__ import annotations

import functools
import json
import posixpath
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from runner.contract.models import RelativePath
from runner.core import safefs
from runner.core.redaction import quote
from runner.core.safefs import UnsafePath
from runner.models.envelope import AgentResultFlag, AgentResultRecord, FileRef
from runner.models.selfreport import ContractResult, Preflight, ShortResult, validate
from runner.staging.jobdir import job_file_problem, sha256_under

__all__ = ["FLAGS", "MAX_FLAGS", "flags_markdown", "read", "warning"]

RESULT_FILE = "result.json"

MAX_LISTED = 1000
"""At most this many files listed in result.json are checked and hashed."""

MAX_FLAGS = 200
"""At most this many flags are recorded; the rest are counted in ``problems``."""

_QUOTE = 200
"""Text from result.json quoted in a flag's message is cut to this many characters."""

FLAGS: dict[str, str] = {
    "path_outside_output": "a path it lists (evidence, output, related evidence, preflight or "
    "workload evidence) is absolute, contains `..` or passes through a symbolic link: it "
    "does not name a file in /job/output, and is not read",
    "path_missing": "a path it lists does not exist",
    "path_unreadable": "a path it lists is not a regular file or folder (a FIFO, a device ...) "
    "or cannot be opened",
    "parser_input_not_in_evidence": "a measurement's parser input "
    "(`parser.evidencePath`) exists but is not listed in `evidence`",
    "preflight_missing": "the contract declares `protocol.preflight` and "
    "result.json has no `preflight`",
    "preflight_source_not_agent": "`preflight.source` is not `agent`",
    "preflight_evidence_path_mismatch": "`preflight.evidencePath` is not the contract's "
    "`protocol.preflight.evidencePath`",
    "preflight_check_missing": "a check id the contract's `protocol.preflight` declares has no "
    "outcome in `preflight.checks`",
    "preflight_not_passed_but_succeeded": "`execution.status` is `succeeded` while a preflight "
    "check's outcome is not `passed`",
    "failure_with_success": "`execution.status` is `succeeded` and `execution.failure` is not null",
    "failure_missing": "`execution.status` is `failed` or `partial` and `execution.failure` is "
    "null",
    "status_disagrees": "the top-level `status` and `execution.status` say different things "
    "(`completed` goes with `succeeded`)",
    "workload_evidence_missing": "a `workloadCompletion` entry has no `evidencePath`",
    "workload_evidence_not_in_evidence": "a `workloadCompletion` entry's `evidencePath` is not "
    "listed in `evidence`",
    "workload_group_duplicate": "a group appears twice in `workloadCompletion`",
    "workload_group_unknown": "a `workloadCompletion` group is not one the contract's "
    "`protocol.workload` declares",
    "workload_group_missing": "`execution.status` is `succeeded` and a group the contract's "
    "`protocol.workload` declares has no `workloadCompletion` entry",
    "code_change_path_unsafe": "a `codeChanges` path is absolute or contains `..`",
    "claim_contradicts_runner": "the job says it succeeded (`completed`, `succeeded`) and the "
    "runner's status is not `succeeded`, or the other way round",
}
"""Every flag code, with when it is raised; the README's table is generated from it."""

_PASSED = frozenset({"passed", "pass", "ok", "succeeded", "success"})
"""Preflight outcomes that count as passed (compared in lower case)."""

_AS_EXECUTION = {"completed": "succeeded", "partial": "partial", "failed": "failed"}


def _quote(text: str) -> str:
    """Job-written text for a message: redacted whole, then cut short
    (:func:`runner.core.redaction.quote`), JSON-quoted (no control characters)."""
    return json.dumps(quote(text, _QUOTE + 3))


@functools.cache
def _relative_adapter() -> TypeAdapter[str]:
    return TypeAdapter(RelativePath)


def _relative(path: str) -> str | None:
    """``path`` normalized when it names something inside /job/output, else None."""
    try:
        _relative_adapter().validate_python(path)
    except ValidationError:
        return None
    return posixpath.normpath(path)


def _path_code(exc: UnsafePath) -> str:
    if exc.missing:
        return "path_missing"
    if "symbolic link" in exc.problem or "leaves" in exc.problem:
        return "path_outside_output"
    return "path_unreadable"


@dataclass
class _Hasher:
    """Hashes the files result.json lists, within one budget of bytes for all of them."""

    output: Path
    budget: int

    def ref(self, rel: str) -> FileRef:
        return self.listed(rel, folders=False)[0]

    def listed(self, rel: str, *, folders: bool = True) -> tuple[FileRef, str | None]:
        """The file's reference, and the flag code when it is not a readable file."""
        try:
            sha256, size = sha256_under(self.output, rel, self.budget)
        except UnsafePath as exc:
            if folders and not exc.missing and self._is_folder(rel):
                return FileRef(path=rel, problem="is a folder; not hashed"), None
            return FileRef(path=rel, exists=False, problem=job_file_problem(exc)), _path_code(exc)
        except OSError as exc:
            return FileRef(path=rel, problem=f"cannot be read: {exc.strerror}"), "path_unreadable"
        if sha256 is None:  # opened and sized once; not read past the budget
            problem = (
                f"is {size:,} bytes, past what is left ({self.budget:,} bytes) of the cap on "
                "hashing a job's files (maxEvidenceMb); not hashed"
            )
            return FileRef(path=rel, size=size, problem=problem), None
        self.budget -= size
        return FileRef(path=rel, exists=True, sha256=f"sha256:{sha256}", size=size), None

    def _is_folder(self, rel: str) -> bool:
        try:
            return stat.S_ISDIR(safefs.lstat_under(self.output, rel).st_mode)
        except (UnsafePath, OSError):
            return False

    def is_file(self, rel: str) -> bool:
        try:
            return stat.S_ISREG(safefs.lstat_under(self.output, rel).st_mode)
        except (UnsafePath, OSError):
            return False


def _contract_preflight(contract: Mapping[str, Any]) -> tuple[list[str], str | None] | None:
    """The check ids and evidence path of the contract's ``protocol.preflight`` (an object
    with ``checks``, or a list of checks; each with ``id`` or ``checkId``); None when it
    declares none. Read from the raw contract, whatever its model says."""
    protocol = contract.get("protocol")
    declared = protocol.get("preflight") if isinstance(protocol, Mapping) else None
    if declared is None:
        return None
    evidence = declared.get("evidencePath") if isinstance(declared, Mapping) else None
    checks = declared.get("checks") if isinstance(declared, Mapping) else declared
    return _ids(checks, "id", "checkId"), evidence if isinstance(evidence, str) else None


def _contract_groups(contract: Mapping[str, Any]) -> list[str] | None:
    """The group ids of the contract's ``protocol.workload`` (an object with ``groups``, or a
    list of groups; each with ``groupId`` or ``id``); None when it declares none."""
    protocol = contract.get("protocol")
    declared = protocol.get("workload") if isinstance(protocol, Mapping) else None
    if declared is None:
        return None
    groups = declared.get("groups") if isinstance(declared, Mapping) else declared
    return _ids(groups, "groupId", "id")


def _ids(items: Any, *keys: str) -> list[str]:
    """The ids of a list of objects (the first of ``keys`` each has), or an object's keys."""
    if isinstance(items, Mapping):
        return [k for k in items if isinstance(k, str)]
    out: dict[str, None] = {}  # in order, each once: a set's lookups on a hostile count
    for item in items if isinstance(items, list) else []:
        if isinstance(item, Mapping):
            found = next((item[k] for k in keys if isinstance(item.get(k), str)), None)
            if found is not None:
                out.setdefault(found)
    return list(out)


@dataclass
class _Checker:
    """Checks one schema-valid result.json; every disagreement becomes a flag."""

    result: ContractResult | ShortResult
    contract: Mapping[str, Any] | None
    hasher: _Hasher
    flags: list[AgentResultFlag] = field(default_factory=list)
    unrecorded: int = 0
    files: dict[str, FileRef] = field(default_factory=dict)
    unlisted: int = 0

    def flag(self, code: str, path: str, message: str) -> None:
        if len(self.flags) >= MAX_FLAGS:
            self.unrecorded += 1
            return
        self.flags.append(AgentResultFlag(code=code, path=path, message=quote(message, 1000, "")))

    def run(self, verdict: str | None) -> None:
        self.paths()
        r = self.result
        if isinstance(r, ContractResult):
            self.status(r)
            self.code_changes(r)
            if self.contract is not None:
                self.parser_inputs(r, self.contract)
                self.preflight(r, self.contract)
            self.workload(r, self.contract)
        if verdict is not None:
            self.verdict(verdict)

    def listed_paths(self) -> Iterator[tuple[str, str]]:
        """Every path result.json names in /job/output: (its JSON path, the path)."""
        r = self.result
        for i, e in enumerate(r.evidence):
            yield f"$.evidence[{i}].path", e.path
        for i, o in enumerate(r.outputs):
            yield f"$.outputs[{i}].path", o.path
            for j, rel in enumerate(o.relatedEvidencePaths):
                yield f"$.outputs[{i}].relatedEvidencePaths[{j}]", rel
        if isinstance(r, ContractResult):
            if r.preflight is not None and r.preflight.evidencePath is not None:
                yield "$.preflight.evidencePath", r.preflight.evidencePath
            for i, w in enumerate(r.workloadCompletion):
                if w.evidencePath is not None:
                    yield f"$.workloadCompletion[{i}].evidencePath", w.evidencePath

    def paths(self) -> None:
        """Each path it names: inside /job/output, there, a file (or a folder); hashed."""
        for at, path in self.listed_paths():
            rel = _relative(path)
            if rel is None:
                self.flag(
                    "path_outside_output",
                    at,
                    f"{_quote(path)} is absolute, contains '..' or a control character: it "
                    "names nothing in /job/output and was not read",
                )
                continue
            if rel in self.files:
                continue
            if len(self.files) >= MAX_LISTED:
                self.unlisted += 1
                continue
            ref, code = self.hasher.listed(rel)
            self.files[rel] = ref
            if code is not None:
                self.flag(code, at, f"result.json lists {_quote(path)}, which {ref.problem}")

    def evidence(self) -> set[str]:
        return {p for e in self.result.evidence if (p := _relative(e.path)) is not None}

    def status(self, r: ContractResult) -> None:
        ex = r.execution
        if ex.status == "succeeded" and ex.failure is not None:
            self.flag(
                "failure_with_success",
                "$.execution.failure",
                "execution.status is succeeded, yet execution.failure is not null "
                f"(category {_quote(ex.failure.category)})",
            )
        if ex.status != "succeeded" and ex.failure is None:
            self.flag(
                "failure_missing",
                "$.execution.failure",
                f"execution.status is {ex.status}, and execution.failure is null: no reason",
            )
        if r.status is not None and _AS_EXECUTION[r.status] != ex.status:
            self.flag(
                "status_disagrees",
                "$.status",
                f"status is {r.status} while execution.status is {ex.status}",
            )

    def code_changes(self, r: ContractResult) -> None:
        for i, change in enumerate(r.codeChanges):
            if _relative(change.path) is None:
                self.flag(
                    "code_change_path_unsafe",
                    f"$.codeChanges[{i}].path",
                    f"{_quote(change.path)} is not a safe relative path (absolute or '..')",
                )

    def parser_inputs(self, r: ContractResult, contract: Mapping[str, Any]) -> None:
        """Every parser input the job left in /job/output is listed in evidence (one it did
        not leave is the measurement's own error in the envelope, not the job's omission)."""
        listed = self.evidence()
        unlisted: dict[str, list[str]] = {}
        measurements = contract.get("measurements")
        for m in measurements if isinstance(measurements, list) else []:
            binding = m.get("parser") if isinstance(m, Mapping) else None
            path = binding.get("evidencePath") if isinstance(binding, Mapping) else None
            rel = _relative(path) if isinstance(path, str) else None
            if rel is not None and rel not in listed:
                unlisted.setdefault(rel, []).append(str(m.get("measurementId")))
        for rel, ids in unlisted.items():
            if self.hasher.is_file(rel):
                self.flag(
                    "parser_input_not_in_evidence",
                    "$.evidence",
                    f"the parser input {rel} (measurement {', '.join(ids)}) is in /job/output "
                    "but not listed in evidence",
                )

    def preflight(self, r: ContractResult, contract: Mapping[str, Any]) -> None:
        declared = _contract_preflight(contract)
        pf = r.preflight
        if pf is None:
            if declared is not None:
                self.flag(
                    "preflight_missing",
                    "$.preflight",
                    "the contract declares protocol.preflight "
                    f"(checks {', '.join(declared[0]) or 'none named'}); result.json has none",
                )
            return
        if pf.source != "agent":
            got = "missing" if pf.source is None else _quote(pf.source)
            self.flag("preflight_source_not_agent", "$.preflight.source", f"it is {got}")
        want = declared[1] if declared is not None else None
        if want is not None and _norm(pf.evidencePath) != _norm(want):
            got = "missing" if pf.evidencePath is None else _quote(pf.evidencePath)
            self.flag(
                "preflight_evidence_path_mismatch",
                "$.preflight.evidencePath",
                f"it is {got}; the contract's is {want}",
            )
        outcomes = list(_outcomes(pf))
        succeeded = r.execution.status == "succeeded"
        known = {key for _, key, _ in outcomes}
        for check in declared[0] if declared is not None else []:
            if check not in known:
                self.flag(
                    "preflight_check_missing",
                    "$.preflight.checks",
                    f"the contract's preflight check {check} has no outcome"
                    + (" while execution.status is succeeded" if succeeded else ""),
                )
        for at, key, outcome in outcomes if succeeded else []:
            if outcome is None or outcome.lower() not in _PASSED:
                said = "no outcome" if outcome is None else f"outcome {_quote(outcome)}"
                self.flag(
                    "preflight_not_passed_but_succeeded",
                    at,
                    f"preflight check {_quote(key or '(no id)')} has {said}, yet "
                    "execution.status is succeeded",
                )

    def workload(self, r: ContractResult, contract: Mapping[str, Any] | None) -> None:
        groups = _contract_groups(contract) if contract is not None else None
        known = set(groups or ())  # looked up once per entry of the job's list
        listed = self.evidence()
        seen: set[str] = set()
        for i, w in enumerate(r.workloadCompletion):
            at = f"$.workloadCompletion[{i}]"
            if w.evidencePath is None:
                self.flag(
                    "workload_evidence_missing",
                    at,
                    f"group {_quote(w.groupId)} names no evidencePath for its units",
                )
            elif (rel := _relative(w.evidencePath)) is not None and rel not in listed:
                self.flag(
                    "workload_evidence_not_in_evidence",
                    f"{at}.evidencePath",
                    f"{_quote(w.evidencePath)} (group {_quote(w.groupId)}) is not listed in "
                    "evidence",
                )
            if w.groupId in seen:
                self.flag(
                    "workload_group_duplicate",
                    f"{at}.groupId",
                    f"group {_quote(w.groupId)} appears more than once",
                )
            elif groups is not None and w.groupId not in known:
                self.flag(
                    "workload_group_unknown",
                    f"{at}.groupId",
                    f"group {_quote(w.groupId)} is not one of the contract's workload groups",
                )
            seen.add(w.groupId)
        if groups is not None and r.execution.status == "succeeded":
            for group in groups:
                if group not in seen:
                    self.flag(
                        "workload_group_missing",
                        "$.workloadCompletion",
                        f"the contract's workload group {group} has no entry, yet "
                        "execution.status is succeeded",
                    )

    def verdict(self, verdict: str) -> None:
        r = self.result
        if isinstance(r, ContractResult):
            at, said = "$.execution.status", str(r.execution.status)
            claimed = said
        else:
            at, said = "$.status", str(r.status)
            claimed = _AS_EXECUTION[r.status]
        if (claimed == "succeeded") != (verdict == "succeeded"):
            self.flag(
                "claim_contradicts_runner",
                at,
                f"the job says {said}; the runner's status is {verdict}",
            )


def _norm(path: str | None) -> str | None:
    return None if path is None else posixpath.normpath(path)


def _outcomes(pf: Preflight) -> Iterator[tuple[str, str | None, str | None]]:
    """Each preflight outcome: (its JSON path, its check id, its outcome)."""
    if isinstance(pf.checks, dict):
        for key, value in pf.checks.items():
            at = f"$.preflight.checks.{key}" if key.isidentifier() else "$.preflight.checks"
            outcome = value if isinstance(value, str) else value.result
            yield at, key, outcome
    else:
        for i, check in enumerate(pf.checks):
            yield f"$.preflight.checks[{i}]", check.key, check.result


def read(
    output: Path,
    max_bytes: int,
    max_result_bytes: int,
    *,
    contract: Mapping[str, Any] | None = None,
    verdict: str | None = None,
) -> AgentResultRecord | None:
    """The job's result.json, checked; None when the job wrote none. result.json itself is
    read only up to ``max_result_bytes`` (it is copied into the envelope); the files it lists
    are hashed within ``max_bytes`` all together. ``contract`` (the contract's raw data)
    and ``verdict`` (the runner's status) are what it is checked against, when given.
    Nothing in it can fail the run: whatever is wrong with it is a recorded problem or flag."""
    hasher = _Hasher(output, max_bytes)
    own = hasher.ref(RESULT_FILE)
    if not own.exists and own.problem == "does not exist":
        return None
    if not own.exists:
        return AgentResultRecord(valid=False, problems=[f"result.json {own.problem}"], file=own)
    if (own.size or 0) > max_result_bytes:
        problem = (
            f"result.json is {own.size:,} bytes, over the {max_result_bytes:,} byte cap on what "
            "is copied into the envelope: not read (maxResultKb in the host policy)"
        )
        return AgentResultRecord(valid=False, problems=[problem], file=own)
    try:
        with safefs.open_under(output, RESULT_FILE) as f:
            raw = f.read(max_result_bytes + 1)
        if len(raw) > max_result_bytes:
            raise ValueError(f"it grew past the {max_result_bytes:,} byte cap while read")
        data: Any = json.loads(raw)
        result = validate(data)
    except ValidationError as exc:
        from runner.contract.load import json_path

        problems = [
            f"result.json {json_path(tuple(e['loc'])[1:])}: {e['msg']}"
            for e in exc.errors(include_url=False)
        ]
        return AgentResultRecord(valid=False, problems=problems[:50], file=own)
    except RecursionError:
        problem = "result.json is nested too deeply to read"
        return AgentResultRecord(valid=False, problems=[problem], file=own)
    except (OSError, ValueError, UnsafePath) as exc:  # JSON and UTF-8 errors are ValueErrors
        problem = quote(f"result.json is not JSON: {exc}", 1000, "")
        return AgentResultRecord(valid=False, problems=[problem], file=own)
    check = _Checker(result, contract, hasher)
    check.run(verdict)
    problems = []
    if check.unlisted:
        problems.append(
            f"result.json lists {len(check.files) + check.unlisted:,} files; the first "
            f"{MAX_LISTED:,} were checked"
        )
    if check.unrecorded:
        problems.append(f"{check.unrecorded:,} more flags than the {MAX_FLAGS} recorded")
    return AgentResultRecord(
        valid=not problems and not check.flags,
        problems=problems,
        flags=check.flags,
        claim=data,
        file=own,
        listed=list(check.files.values()),
    )


def warning(record: AgentResultRecord) -> str | None:
    """The envelope's warning about a result.json that is not valid, or None."""
    if record.valid:
        return None
    said = record.problems + [f"{f.code} at {f.path}: {f.message}" for f in record.flags[:5]]
    more = len(record.flags) - 5
    tail = f" (and {more} more flags in agentResult.flags)" if more > 0 else ""
    return "the job's result.json is not trustworthy: " + "; ".join(said) + tail


def flags_markdown() -> str:
    """The README's table of flag codes."""
    rows = ["| code | raised when |", "|---|---|"]
    rows += [f"| `{code}` | {doc} |" for code, doc in FLAGS.items()]
    return "\n".join(rows) + "\n"
