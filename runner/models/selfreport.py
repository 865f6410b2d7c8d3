"""The job's self-report: the models of the ``result.json`` a job may write to /job/output.

The seed's prompts show two shapes:

- the short summary (``execute-workspace-simple``): ``schemaVersion`` 2.x, ``status``
  completed | partial | failed, ``summary``, ``limitations``, optional ``evidence``;
- the execute-contract result (``execute-contract``, ``execute-workspace``): ``execution``
  (``status`` succeeded | failed | partial, ``failure``), ``preflight``, ``evidence``,
  ``outputs``, ``experiment.commands``, ``codeChanges``, ``diagnosis``,
  ``workloadCompletion``.

A document with an ``execution`` member is read as the second, any other as the first. Fields
beyond the models are kept. ``contracts/agent-result.schema.json`` is generated from these
models, and the same bytes (:func:`schema_bytes`) are what a job is given as
``/job/input/result.schema.json``. What the runner checks of it, and how it records what it
found, is :mod:`runner.evidence.selfreport`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter

__all__ = [
    "SCHEMA_FILE",
    "ContractResult",
    "Preflight",
    "ShortResult",
    "json_schema",
    "rendered_schema",
    "schema_bytes",
    "validate",
]

_PATH = "Relative to /job/output, a file there (or a folder, not hashed)."


class _Open(BaseModel):
    # Built when first used (a job that writes no result.json costs no start-up time).
    model_config = ConfigDict(extra="allow", frozen=True, defer_build=True)


class EvidenceItem(_Open):
    """A file an independent verifier should look at."""

    path: str = Field(min_length=1, description=_PATH)
    description: str | None = None


class OutputItem(_Open):
    """A product of the run: what the experiment produced."""

    path: str = Field(min_length=1, description=_PATH)
    id: str | None = Field(default=None, description="A stable run-local id.")
    kind: (
        Literal[
            "table",
            "figure",
            "dataset",
            "model",
            "checkpoint",
            "text",
            "archive",
            "audio",
            "video",
            "other",
        ]
        | None
    ) = None
    role: Literal["primary", "supporting"] | None = Field(
        default=None, description="primary: claim-bearing; supporting: a useful derivative."
    )
    description: str | None = None
    relatedEvidencePaths: list[str] = Field(
        default_factory=list, description="Raw evidence explaining how it was produced. " + _PATH
    )
    scientificObjectId: str | None = Field(
        default=None, description="The research object it realizes, by its exact id."
    )


class FailureClaim(_Open):
    """Why the job says it did not succeed."""

    category: str = Field(description="E.g. resource_exhausted, timeout, protocol_ambiguous.")
    stage: str
    retryable: bool
    reason: str = Field(description="The concrete reason.")


class Execution(_Open):
    """How the execution ended, by the job's account."""

    status: Literal["succeeded", "failed", "partial"]
    failure: FailureClaim | None = Field(
        default=None, description="null when succeeded; filled when failed or partial."
    )


class PreflightCheck(_Open):
    """One contract check's outcome: `id` (or `checkId`) and `status` (or `outcome`);
    `passed` passes (so do `pass`, `ok`, `succeeded` and `success`), anything else does not."""

    id: str | None = None
    checkId: str | None = None
    status: str | None = None
    outcome: str | None = None

    @property
    def key(self) -> str | None:
        return self.id if self.id is not None else self.checkId

    @property
    def result(self) -> str | None:
        return self.status if self.status is not None else self.outcome


class Preflight(_Open):
    """The preflight the job ran: one outcome per check id of the contract's
    `protocol.preflight`."""

    source: str | None = Field(default=None, description="Must be `agent`.")
    evidencePath: str | None = Field(
        default=None, description="The contract's preflight evidence path, when it names one."
    )
    checks: list[PreflightCheck] | dict[str, str | PreflightCheck] = Field(
        default_factory=list,
        description="A list of outcomes, or an object from check id to outcome.",
    )


class Experiment(_Open):
    commands: list[Any] = Field(
        default_factory=list, description="Decisive commands that actually ran; may be empty."
    )


class CodeChange(_Open):
    path: str = Field(
        min_length=1, description="A safe relative logical path (runtime-venv/lib/...)."
    )
    kind: Literal["environment", "execution", "scientific"]


class WorkloadEntry(_Open):
    """Completed full units of one workload group of the contract's `protocol.workload`."""

    groupId: str
    units: float = Field(ge=0)
    evidencePath: str | None = Field(
        default=None, description="The raw evidence of the units; listed in `evidence`. " + _PATH
    )


_Version = Annotated[str, Field(pattern=r"^2\.\d+$")]
_Status = Literal["completed", "partial", "failed"]


class ShortResult(_Open):
    """The short summary: what ran, what it showed."""

    model_config = ConfigDict(
        extra="allow",
        frozen=True,
        defer_build=True,
        json_schema_extra={"not": {"required": ["execution"]}},
    )

    schemaVersion: _Version
    status: _Status
    summary: str
    limitations: list[str] = Field(default_factory=list)
    evidence: list[EvidenceItem] = Field(default_factory=list)
    outputs: list[OutputItem] = Field(default_factory=list)


class ContractResult(_Open):
    """The execute-contract result."""

    schemaVersion: _Version | None = None
    status: _Status | None = Field(
        default=None, description="Optional; when given it agrees with execution.status."
    )
    summary: str | None = None
    limitations: list[str] = Field(default_factory=list)
    execution: Execution
    preflight: Preflight | None = Field(
        default=None, description="Required when the contract declares protocol.preflight."
    )
    evidence: list[EvidenceItem] = Field(
        default_factory=list, description="Every available parser input, and other raw evidence."
    )
    outputs: list[OutputItem] = Field(default_factory=list)
    experiment: Experiment | None = None
    codeChanges: list[CodeChange] = Field(default_factory=list)
    diagnosis: str | None = Field(default=None, description="Markdown, for the next researcher.")
    workloadCompletion: list[WorkloadEntry] = Field(
        default_factory=list,
        description="When succeeded, one entry per group of the contract's protocol.workload.",
    )


def _shape(value: Any) -> str:
    return "contract" if isinstance(value, dict) and "execution" in value else "short"


SelfReport = Annotated[
    Annotated[ContractResult, Tag("contract")] | Annotated[ShortResult, Tag("short")],
    Discriminator(_shape),
]
"""What a job writes to /job/output/result.json: one shape or the other."""

_DESCRIPTION = (
    "What a job writes to /job/output/result.json (given to it as "
    "/job/input/result.schema.json). Two shapes: the execute-contract result (it has "
    "`execution`) or the short summary (`schemaVersion` 2.x, `status`, `summary`). Members "
    "beyond these are allowed and kept. Paths are relative to /job/output. The runner checks "
    "it independently and records every disagreement; it never takes its numbers."
)


@functools.cache
def _adapter() -> TypeAdapter[ContractResult | ShortResult]:
    """Built on first use: a run whose job writes no result.json pays nothing for it."""
    return TypeAdapter(SelfReport)


def validate(data: Any) -> ContractResult | ShortResult:
    """``data`` as one of the two shapes; raises pydantic's ``ValidationError``."""
    return _adapter().validate_python(data)


def json_schema() -> dict[str, Any]:
    """``contracts/agent-result.schema.json``: the JSON Schema of what a job must write."""
    schema = _adapter().json_schema(mode="validation")
    filename = "agent-result.schema.json"
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://runner.invalid/contracts/{filename}",
        "title": "The job's own result.json",
        "description": _DESCRIPTION,
        **schema,
    }


SCHEMA_FILE = Path(__file__).with_name("agent-result.schema.json")
"""The shipped copy of ``contracts/agent-result.schema.json`` (package data), written with it by
``python -m runner.app.schemas`` from :func:`rendered_schema` and checked against the models by
its ``--check`` and by the tests."""


def rendered_schema() -> bytes:
    """:func:`json_schema` as the bytes of the file (sorted keys, two-space indent)."""
    return (json.dumps(json_schema(), indent=2, sort_keys=True) + "\n").encode()


@functools.cache
def schema_bytes() -> bytes:
    """The bytes of ``contracts/agent-result.schema.json``, to stage as
    ``/job/input/result.schema.json``: read from the shipped copy, because generating it
    (pydantic's schema generation) was about 35 ms of every fresh ``runner run``."""
    return SCHEMA_FILE.read_bytes()
