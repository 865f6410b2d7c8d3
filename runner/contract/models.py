"""Pydantic models of the execution contract (``task.json``).

The shape follows the CiteArk execution contract (``schemaVersion`` 1.0, ``kind``
``citeark.execution-contract``). Objects the runner acts on (``environment``, ``protocol``,
``measurements``) forbid unknown fields; descriptive objects (``research``, ``paper``, ``agent``
...) are carried as given. Fields the seed leaves to an agent and a runner needs are optional
additions documented in each field's description: ``protocol.command``, ``protocol.stdoutPath``,
``protocol.stderrPath``, ``protocol.workingDirectory``, ``environment.imageId``,
``environment.pidsLimit``, ``environment.tmpfsMb``, ``environment.diskGb``, ``jobId``,
``issuedAt``, ``expiresAt``, ``audience``, ``paper.digest`` and ``repository.digest``.

``contracts/execution-contract.schema.json`` is generated from these models
(``python -m runner.schemas``); a test keeps the two in step.
"""

from __future__ import annotations

import posixpath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, model_validator

SHA256_PATTERN = r"^sha256:[0-9a-f]{64}$"
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"


def _no_control(value: str) -> None:
    bad = next((c for c in value if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0), None)
    if bad is not None:
        raise ValueError(
            f"must not contain control characters (newline, tab, escape ...); found {bad!r}"
        )


def _relative_path(value: str) -> str:
    """A POSIX path relative to its base that cannot escape it."""
    if not value or "\x00" in value or "\\" in value:
        raise ValueError("must be a non-empty POSIX path without NUL or backslash")
    _no_control(value)
    if value.startswith("/"):
        raise ValueError(f"must be relative to its base, got the absolute path {value!r}")
    normalized = posixpath.normpath(value)
    if normalized == ".." or normalized.startswith("../") or ".." in value.split("/"):
        raise ValueError(f"must stay inside its base; {value!r} contains '..'")
    return value


def _absolute_container_path(value: str) -> str:
    if not value.startswith("/") or "\x00" in value or ".." in value.split("/"):
        raise ValueError(
            f"must be an absolute path inside the container without '..', got {value!r}"
        )
    _no_control(value)
    return value


RelativePath = Annotated[str, AfterValidator(_relative_path)]
"""A path relative to a base directory; absolute paths and ``..`` are refused."""

ContainerPath = Annotated[str, AfterValidator(_absolute_container_path)]
Sha256 = Annotated[str, Field(pattern=SHA256_PATTERN)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class Research(_Open):
    """Identifiers of the research work, claim and experiment this contract serves."""

    workId: str | None = None
    claimId: str | None = None
    claimVersionId: str | None = None
    experimentId: str | None = None
    experimentVersionId: str | None = None
    measurementIds: list[str] = Field(default_factory=list)


_DIGEST_DOC = (
    "Runner addition. The content digest of what path names, filled in by `runner pin` or "
    "`runner sign`: for a file the SHA-256 of its bytes, for a folder the SHA-256 of its "
    "runner-tree-v1 listing (README, 'Inputs bound to the contract'). The staged input must "
    "hash to it, or nothing runs (input_digest_mismatch)."
)


def _digest_needs_path(digest: str | None, path: str | None) -> None:
    if digest is not None and path is None:
        raise ValueError("digest binds the input that path names; there is no path")


class Paper(_Open):
    """The paper. ``path``, relative to the contract's folder, is copied to ``/job/input``."""

    title: str | None = None
    url: str | None = None
    path: RelativePath | None = None
    digest: Sha256 | None = Field(default=None, description=_DIGEST_DOC)

    @model_validator(mode="after")
    def _digest_of_path(self) -> Paper:
        _digest_needs_path(self.digest, self.path)
        return self


class Repository(_Open):
    """The code. ``path``, relative to the contract's folder, is copied to ``/job/input``."""

    url: str | None = None
    commit: str | None = Field(
        default=None,
        description="The commit the code is. When it is a commit id (7 to 40 hex digits, or 64) "
        "and the staged path holds a .git folder, the staged tree must be exactly that "
        "commit's tree (.git aside), or nothing runs (input_digest_mismatch).",
    )
    path: RelativePath | None = None
    digest: Sha256 | None = Field(default=None, description=_DIGEST_DOC)

    @model_validator(mode="after")
    def _digest_of_path(self) -> Repository:
        _digest_needs_path(self.digest, self.path)
        return self


class Claim(_Open):
    """The claim under test, as the paper states it."""

    text: str | None = None
    source: str | None = None


class ParserBinding(_Strict):
    """Which registered parser reads which evidence file, and how."""

    id: str = Field(min_length=1, description="Registered parser id, e.g. json.scalar.")
    version: str = Field(min_length=1, description="Parser version; recorded in the envelope.")
    evidencePath: RelativePath = Field(description="Evidence file, relative to /job/output.")
    config: dict[str, Any] = Field(
        default_factory=dict, description="Parser configuration; checked against its schema."
    )


class Measurement(_Strict):
    """One number the job must produce, and the parser that extracts it."""

    measurementId: str = Field(min_length=1)
    metric: str = Field(min_length=1)
    unit: str = Field(min_length=1)
    parser: ParserBinding


class Protocol(_Strict):
    """What to run. ``command`` is the runner's addition: the exact argv executed."""

    entrypoint: str | None = None
    requiredCommandFragments: list[str] = Field(default_factory=list)
    instructions: str | None = None
    command: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None,
        min_length=1,
        description=(
            "Runner addition. The argv run in the container (no shell). Every entry of "
            "requiredCommandFragments must occur in it."
        ),
    )
    workingDirectory: ContainerPath = Field(
        default="/job/workspace", description="Runner addition. Working directory in the container."
    )
    stdoutPath: RelativePath = Field(
        default="logs/stdout.log",
        description="Runner addition. Where the job's stdout is written, relative to /job/output.",
    )
    stderrPath: RelativePath = Field(
        default="logs/stderr.log",
        description="Runner addition. Where the job's stderr is written, relative to /job/output.",
    )

    @model_validator(mode="after")
    def _distinct_streams(self) -> Protocol:
        if posixpath.normpath(self.stdoutPath) == posixpath.normpath(self.stderrPath):
            raise ValueError("stdoutPath and stderrPath must name different files")
        return self


class EstimatedDuration(_Open):
    cpu: float | None = None
    gpu: float | None = None


class ComputeRequirement(_Open):
    """What the research declares it needs; informative. ``environment`` is what is granted."""

    schemaVersion: str | None = None
    source: str | None = None
    classification: str | None = None
    accelerator: str | None = None
    cpuCores: float | None = None
    memoryGb: float | None = None
    gpuCount: int | None = None
    minVramGb: float | None = None
    preferredGpuTypes: list[str] = Field(default_factory=list)
    cpuFallbackAllowed: bool | None = None
    estimatedDurationMinutes: EstimatedDuration | None = None
    rationale: str | None = None


class Agent(_Open):
    """The agent configuration for agentic runs; the runner records it and does not act on it."""

    runtime: str | None = None


class Environment(_Strict):
    """The sealed box the job runs in. Limits are exact caps, never hints."""

    image: str = Field(
        min_length=1,
        description=(
            "Pinned image: 'name@sha256:<manifest digest>' or 'sha256:<image id>'. "
            "A tag alone is refused unless the host allows unpinned images."
        ),
    )
    imageId: Sha256 | None = Field(
        default=None, description="Runner addition. Expected image id (config digest)."
    )
    timeoutMinutes: float = Field(gt=0, le=43200, description="Total runtime budget in minutes.")
    cpus: float = Field(gt=0, le=512)
    memoryGb: float = Field(gt=0, le=4096, description="Memory cap; swap is capped to the same.")
    shmGb: float = Field(default=0.0625, ge=0, le=1024)
    gpu: Literal["none", "all"] | Annotated[int, Field(ge=1, le=64)] = "none"
    networkAccess: bool = False
    pidsLimit: int = Field(default=512, ge=16, le=1_000_000, description="Runner addition.")
    diskGb: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        description="Runner addition. What output/ and workspace/ may hold together (default: "
        "the host policy's maximum); the job is stopped past it.",
    )
    logLimitMb: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        description="Runner addition. Cap on each of stdout and stderr (default: the host "
        "policy's); may only lower the policy's.",
    )
    isolation: Literal["runc", "runsc"] | None = Field(
        default=None,
        description="Runner addition. The container runtime asked for: runc, or gVisor's runsc "
        "(the host policy decides).",
    )
    tmpfsMb: int = Field(
        default=256, ge=1, le=65536, description="Runner addition. Size of the /tmp tmpfs."
    )


class ExecutionContract(_Strict):
    """A signed-off description of one job: what to run, where, with what, and how to read it."""

    schemaVersion: Literal["1.0"]
    kind: Literal["citeark.execution-contract"]
    name: str = Field(min_length=1)
    jobId: str | None = Field(
        default=None,
        pattern=JOB_ID_PATTERN,
        description="Runner addition. Job id; --job-id overrides, else derived from name+digest.",
    )
    issuedAt: AwareDatetime | None = Field(
        default=None, description="Runner addition. When the issuer signed it (RFC 3339)."
    )
    expiresAt: AwareDatetime | None = Field(
        default=None, description="Runner addition. After this instant the contract is refused."
    )
    audience: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None,
        description="Runner addition. Hosts (policy audiences) this contract is meant for.",
    )
    research: Research | None = None
    paper: Paper | None = None
    repository: Repository | None = None
    claim: Claim | None = None
    measurements: list[Measurement] = Field(min_length=1)
    protocol: Protocol
    reproductionLevel: str | None = None
    reconstructionFidelity: str | None = None
    computeRequirement: ComputeRequirement | None = None
    verificationPolicyCommitment: str | None = None
    agent: Agent | None = None
    environment: Environment
    researchGoal: Any = Field(default=None, description="Carried for the job; not interpreted.")
    reproductionScope: Any = Field(
        default=None, description="Carried for the job; not interpreted."
    )
    reproductionGuide: Any = Field(
        default=None, description="Carried for the job; not interpreted."
    )
    researchGraph: Any = Field(default=None, description="Carried for the job; not interpreted.")
    workspacePlan: Any = Field(default=None, description="Carried for the job; not interpreted.")
    contractDigest: Sha256 = Field(
        description="sha256 over the RFC 8785 canonical JSON of the contract without this field."
    )

    @model_validator(mode="after")
    def _unique_measurements(self) -> ExecutionContract:
        seen: set[str] = set()
        for m in self.measurements:
            if m.measurementId in seen:
                raise ValueError(f"measurementId {m.measurementId!r} appears twice")
            seen.add(m.measurementId)
        return self
