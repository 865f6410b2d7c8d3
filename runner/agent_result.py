"""The job's own account of itself: ``/job/output/result.json``, validated, never trusted.

The seed's agents finish by writing ``result.json`` (``schemaVersion`` 2.x, ``status``,
``summary``, ``limitations``, ``evidence`` ...). The runner validates it against
``contracts/agent-result.schema.json``, checks that every file it lists exists inside the
output folder, hashes those files, and embeds the result in the envelope as the job's claim,
beside (never instead of) the runner's own verdict.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runner import safefs
from runner.contract.models import RelativePath
from runner.envelope import AgentResultRecord, FileRef
from runner.safefs import UnsafePath
from runner.staging import job_file_problem, sha256_under

RESULT_FILE = "result.json"


class EvidenceItem(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    path: RelativePath = Field(description="Relative to /job/output.")
    description: str | None = None


class OutputItem(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    path: RelativePath = Field(description="Relative to /job/output.")
    id: str | None = None
    kind: str | None = None
    role: str | None = None
    description: str | None = None


class AgentResult(BaseModel):
    """``/job/output/result.json`` as an agent writes it; fields beyond these are kept."""

    model_config = ConfigDict(extra="allow", frozen=True)

    schemaVersion: str = Field(pattern=r"^2\.\d+$")
    status: Literal["completed", "partial", "failed"]
    summary: str
    limitations: list[str] = Field(default_factory=list)
    evidence: list[EvidenceItem] = Field(default_factory=list)
    outputs: list[OutputItem] = Field(default_factory=list)


MAX_LISTED = 1000
"""At most this many files listed in result.json are checked and hashed."""


@dataclass
class _Hasher:
    """Hashes the files result.json lists, within one budget of bytes for all of them."""

    output: Path
    budget: int

    def ref(self, rel: str) -> FileRef:
        try:
            sha256, size = sha256_under(self.output, rel, self.budget)
        except UnsafePath as exc:
            return FileRef(path=rel, exists=False, problem=job_file_problem(exc))
        except OSError as exc:
            return FileRef(path=rel, problem=f"cannot be read: {exc.strerror}")
        if sha256 is None:  # opened and sized once; not read past the budget
            return FileRef(
                path=rel,
                size=size,
                problem=f"is {size:,} bytes, past what is left ({self.budget:,} bytes) of the "
                "cap on hashing a job's files (maxEvidenceMb); not hashed",
            )
        self.budget -= size
        return FileRef(path=rel, exists=True, sha256=f"sha256:{sha256}", size=size)


def read(output: Path, max_bytes: int, max_result_bytes: int) -> AgentResultRecord | None:
    """The job's result.json, checked; None when the job wrote none. result.json itself is
    read only up to ``max_result_bytes`` (it is copied into the envelope); the files it lists
    are hashed within ``max_bytes`` all together. Nothing in it can fail the run: whatever is
    wrong with it is a recorded problem."""
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
        result = AgentResult.model_validate(data)
    except ValidationError as exc:
        from runner.contract.load import json_path

        problems = [
            f"result.json {json_path(tuple(e['loc']))}: {e['msg']}"
            for e in exc.errors(include_url=False)
        ]
        return AgentResultRecord(valid=False, problems=problems[:50], file=own)
    except RecursionError:
        problem = "result.json is nested too deeply to read"
        return AgentResultRecord(valid=False, problems=[problem], file=own)
    except (OSError, ValueError, UnsafePath) as exc:  # JSON and UTF-8 errors are ValueErrors
        problem = f"result.json is not JSON: {exc}"[:1000]
        return AgentResultRecord(valid=False, problems=[problem], file=own)
    paths = [e.path for e in result.evidence] + [o.path for o in result.outputs]
    listed = list(dict.fromkeys(paths))
    problems = []
    if len(listed) > MAX_LISTED:
        problems.append(
            f"result.json lists {len(listed):,} files; the first {MAX_LISTED:,} were checked"
        )
    files = [hasher.ref(rel) for rel in listed[:MAX_LISTED]]
    problems += [f"result.json lists {f.path}, which {f.problem}" for f in files if not f.exists]
    return AgentResultRecord(
        valid=not problems,
        problems=problems,
        claim=result.model_dump(mode="json"),
        file=own,
        listed=files,
    )


def schema_bytes() -> bytes:
    """The JSON Schema the job's result.json must meet, staged as
    ``/job/input/result.schema.json`` (``contracts/agent-result.schema.json`` is the same)."""
    schema = AgentResult.model_json_schema(mode="validation")
    document = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://runner.invalid/contracts/agent-result.schema.json",
        "title": "The job's own result.json",
        **{k: v for k, v in schema.items() if k != "title"},
    }
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
