"""Pydantic models of the execution contract (``task.json``).

The shape follows the CiteArk execution contract (``schemaVersion`` 1.0, ``kind``
``citeark.execution-contract``) with every field its seed contracts and agent prompts name.
Objects the runner acts on (``environment``, ``protocol``, ``measurements``, the top level)
forbid unknown fields, so a typo is refused with its JSON path; descriptive objects
(``research``, ``paper``, ``agent``, ``campaign`` ...) keep what they are given, and every field
reaches the job's ``/job/input/task.json`` byte for byte (the verified bytes are staged, never a
re-serialisation). Fields the seed leaves to an agent and a runner needs are optional
additions documented in each field's description: ``protocol.command``, ``protocol.stdoutPath``,
``protocol.stderrPath``, ``protocol.workingDirectory``, ``environment.imageId``,
``environment.pidsLimit``, ``environment.tmpfsMb``, ``environment.diskGb``,
``environment.egress``, ``jobId``, ``issuedAt``, ``expiresAt``, ``audience``, ``paper.digest``,
``repository.digest``, ``agent.promptPath`` and ``agent.promptDigest``. ``assets`` entries
that name sources, sha256, size and path are the runner's to fetch and mount
(:mod:`runner.contract.assetspec`); legacy entries are carried.

``contracts/execution-contract.schema.json`` is generated from these models
(``python -m runner.app.schemas``); a test keeps the two in step.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    Field,
    field_validator,
    model_validator,
)

from runner.backends.types import HOST_PORT_PATTERN
from runner.contract.assetspec import Asset, AssetEntry, CarriedAsset
from runner.contract.base import (
    SHA256_PATTERN,
    ContainerPath,
    RelativePath,
    Sha256,
    _Open,
    _Strict,
)

__all__ = [
    "JOB_ID_PATTERN",
    "SHA256_PATTERN",
    "Asset",
    "CarriedAsset",
    "ContainerPath",
    "ExecutionContract",
    "Measurement",
    "RelativePath",
    "Sha256",
]

JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"


class Research(_Open):
    """Identifiers of the research work, claim and experiment this contract serves."""

    workId: str | None = None
    claimId: str | None = None
    claimVersionId: str | None = None
    experimentId: str | None = None
    experimentVersionId: str | None = None
    measurementIds: list[str] = Field(default_factory=list)


_DIGEST_DOC = (
    "Runner addition. The content digest of what path names, filled in by `runner contract "
    "pin` or `runner contract sign`: for a file the SHA-256 of its bytes, for a folder the "
    "SHA-256 of its runner-tree-v1 listing (docs/concepts/contract.md, 'Inputs bound to the "
    "contract'). The staged input must hash to it, or nothing runs (input_digest_mismatch)."
)


def _digest_needs_path(digest: str | None, path: str | None) -> None:
    if digest is not None and path is None:
        raise ValueError("digest binds the input that path names; there is no path")


class Paper(_Open):
    """The paper. ``path``, relative to the contract's folder, is copied to ``/job/input``."""

    title: str | None = None
    url: str | None = None
    path: RelativePath | None = None
    markdownPath: str | None = Field(
        default=None,
        description="Carried for the job: the paper as Markdown with 'PDF page N' markers.",
    )
    sourceMapPath: str | None = Field(
        default=None, description="Carried for the job: block coordinates of the Markdown."
    )
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
    implementationOrigin: str | None = Field(
        default=None,
        description="Carried for the job: whose code this is (official, reconstruction ...).",
    )
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
    dimensions: dict[str, Any] | None = Field(
        default=None,
        description="Carried for the job: the blind scientific scope of the number (dataset, "
        "split, sample count, repetitions, aggregation, hardware ...).",
    )
    aggregation: Any = Field(default=None, description="Carried for the job.")
    description: str | None = Field(default=None, description="Carried for the job.")


class PreflightCheck(_Open):
    """One check the job must report an outcome for before expensive work."""

    id: str = Field(min_length=1, description="Check id; result.json must report each one.")


class Preflight(_Open):
    """Checks the job runs before expensive work (runtime, dependencies, assets, parsers)."""

    evidencePath: RelativePath | None = Field(
        default=None,
        description="Where the job writes its preflight outcomes, relative to /job/output.",
    )
    checks: list[PreflightCheck] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_checks(self) -> Preflight:
        counted = Counter(
            c.id for c in self.checks
        )  # not ids.count(i) for each: n² on a hostile list
        twice = sorted(i for i, n in counted.items() if n > 1)
        if twice:
            raise ValueError(f"preflight check id(s) {', '.join(map(repr, twice))} appear twice")
        return self


class WorkloadGroup(_Open):
    """A cost or method group of the workload, counted in complete units."""

    groupId: str = Field(min_length=1)
    units: int | None = Field(default=None, ge=0)


class Workload(_Open):
    """The full workload the job must complete; result.json reports each group's units."""

    groups: list[WorkloadGroup] = Field(default_factory=list)


EXECUTION_MODES = ("fixed_entrypoint", "agent_planned")


class Protocol(_Strict):
    """What to run. ``command`` is the runner's addition: the exact argv executed."""

    executionMode: Literal["fixed_entrypoint", "agent_planned"] | None = Field(
        default=None,
        description="fixed_entrypoint: run protocol.command unchanged. agent_planned: an agent "
        "runtime decides the commands. Absent: fixed_entrypoint when protocol.command is given, "
        "else agent_planned when agent.runtime is.",
    )
    entrypoint: str | None = None
    objective: str | None = Field(
        default=None, description="Carried for the job: what an agent_planned run must achieve."
    )
    requiredCommandFragments: list[str] = Field(default_factory=list)
    instructions: str | None = None
    preflight: Preflight | None = Field(
        default=None, description="Checks result.json must report (checked by the runner)."
    )
    workload: Workload | None = Field(
        default=None, description="Workload groups result.json must report (checked)."
    )
    benchmark: dict[str, Any] | None = Field(
        default=None,
        description="Carried for the job: an immutable hardware benchmark (device, batch size, "
        "dtype, warmup, timed iterations, timer ...).",
    )
    referenceHardware: Any = Field(default=None, description="Carried for the job.")
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
    """The agent of an agent_planned run. The contract chooses the runtime and its limits; the
    host decides which runtimes exist."""

    runtime: str | None = Field(
        default=None,
        description="The agent runtime (the host policy's agents name those it offers).",
    )
    promptPath: RelativePath | None = Field(
        default=None,
        description="Runner addition. The prompt the agent gets: a file relative to the "
        "contract's folder, staged into /job/input at the same path like paper.path.",
    )
    promptDigest: Sha256 | None = Field(
        default=None, description=_DIGEST_DOC.replace("what path names", "the prompt")
    )
    model: str | None = None
    subagentModel: str | None = None
    autoCompactWindow: int | None = Field(default=None, ge=0)
    effort: str | None = None
    reasoningMode: str | None = None
    maxTurns: int | None = Field(
        default=None,
        ge=0,
        description="Turns the agent may take over every attempt; the runner stops it past "
        "them (resource_exhausted).",
    )
    maxBudgetUsd: float | None = Field(
        default=None,
        ge=0,
        description="USD the agent may spend over every attempt; the runner stops it past them.",
    )
    validationRetries: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _digest_of_prompt(self) -> Agent:
        _digest_needs_path(self.promptDigest, self.promptPath)
        return self


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
    egress: list[Annotated[str, Field(pattern=HOST_PORT_PATTERN, max_length=259)]] | None = Field(
        default=None,
        max_length=256,
        description="Runner addition. host:port pairs the job may reach, and nothing else: "
        "through the runner's proxy (HTTPS_PROXY, HTTP_PROXY), each pair granted by the host "
        "policy's egress.allow. Null: no network (unless networkAccess).",
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
    scientificPlanningPolicy: Any = Field(
        default=None, description="Carried for the job; not interpreted."
    )
    campaign: dict[str, Any] | None = Field(
        default=None,
        description="Carried for the job: a selected experiment set on one machine (members, "
        "measurementMap, workloads) with one budget.",
    )
    assets: list[AssetEntry] | None = Field(
        default=None,
        max_length=1024,
        description="Datasets and checkpoints. An asset with sources, sha256, size and path is "
        "fetched on the host (`runner fetch`), verified and mounted read-only at "
        "/job/assets/<path>; one with none of them (a legacy entry: id and acquisition hints) "
        "is carried for the job only.",
    )
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

    @property
    def execution_mode(self) -> Literal["fixed_entrypoint", "agent_planned"] | None:
        """The mode asked for, or inferred: a command means fixed_entrypoint, an agent runtime
        without one agent_planned; None when the contract says neither."""
        if self.protocol.executionMode is not None:
            return self.protocol.executionMode
        if self.protocol.command:
            return "fixed_entrypoint"
        if self.agent is not None and self.agent.runtime:
            return "agent_planned"
        return None

    @property
    def fetched_assets(self) -> list[Asset]:
        """The assets the runner fetches and mounts (legacy carried entries left out)."""
        return [a for a in self.assets or [] if isinstance(a, Asset)]

    @field_validator("assets")
    @classmethod
    def _distinct_assets(cls, assets: list[Asset | CarriedAsset] | None) -> Any:
        seen_ids: set[str] = set()
        paths: list[str] = []
        for a in assets or []:
            if not isinstance(a, Asset):
                continue
            if a.id in seen_ids:
                raise ValueError(f"asset id {a.id!r} appears twice in assets")
            seen_ids.add(a.id)
            for other in paths:
                if (
                    a.path == other
                    or a.path.startswith(other + "/")
                    or other.startswith(a.path + "/")
                ):
                    raise ValueError(
                        f"asset {a.id!r}: path {a.path!r} overlaps {other!r}; each asset needs "
                        "its own place under /job/assets"
                    )
            paths.append(a.path)
        return assets

    @model_validator(mode="after")
    def _unique_measurements(self) -> ExecutionContract:
        seen: set[str] = set()
        for m in self.measurements:
            if m.measurementId in seen:
                raise ValueError(f"measurementId {m.measurementId!r} appears twice")
            seen.add(m.measurementId)
        return self
