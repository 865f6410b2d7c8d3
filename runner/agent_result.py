"""The job's own account of itself: ``/job/output/result.json``, validated, never trusted.

The seed's agents finish by writing ``result.json`` (``schemaVersion`` 2.x, ``status``,
``summary``, ``limitations``, ``evidence`` ...). The runner validates it against
``contracts/agent-result.schema.json``, checks that every file it lists exists inside the
output folder, hashes those files, and embeds the result in the envelope as the job's claim,
beside (never instead of) the runner's own verdict.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runner.contract.models import RelativePath
from runner.envelope import AgentResultRecord, FileRef
from runner.errors import EvidenceError
from runner.staging import resolve_inside, sha256_file

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


def _hash(output: Path, rel: str) -> FileRef:
    try:
        path = resolve_inside(output, rel)
    except EvidenceError:
        return FileRef(path=rel, exists=False, problem="leads outside /job/output")
    if not path.is_file():
        return FileRef(path=rel, exists=False, problem="does not exist")
    sha256, size = sha256_file(path)
    return FileRef(path=rel, exists=True, sha256=f"sha256:{sha256}", size=size)


def read(output: Path, max_bytes: int) -> AgentResultRecord | None:
    """The job's result.json, checked; None when the job wrote none."""
    path = output / RESULT_FILE
    if not path.exists() and not path.is_symlink():
        return None
    own = _hash(output, RESULT_FILE)
    if not own.exists:
        return AgentResultRecord(valid=False, problems=[f"result.json {own.problem}"], file=own)
    if (own.size or 0) > max_bytes:
        problem = f"result.json is {own.size} bytes, over the {max_bytes} byte cap: not read"
        return AgentResultRecord(valid=False, problems=[problem], file=own)
    try:
        data: Any = json.loads(path.read_bytes())
        result = AgentResult.model_validate(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return AgentResultRecord(
            valid=False, problems=[f"result.json is not JSON: {exc}"], file=own
        )
    except ValidationError as exc:
        from runner.contract.load import json_path

        problems = [
            f"result.json {json_path(tuple(e['loc']))}: {e['msg']}"
            for e in exc.errors(include_url=False)
        ]
        return AgentResultRecord(valid=False, problems=problems, file=own)
    listed = [e.path for e in result.evidence] + [o.path for o in result.outputs]
    files = [_hash(output, rel) for rel in dict.fromkeys(listed)]
    problems = [f"result.json lists {f.path}, which {f.problem}" for f in files if not f.exists]
    return AgentResultRecord(
        valid=not problems,
        problems=problems,
        claim=result.model_dump(mode="json"),
        file=own,
        listed=files,
    )
