"""The result envelope: what happened, in a form anyone can check.

``contracts/result-envelope.schema.json`` is generated from these models.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Category = Literal[
    "invalid_contract",
    "signature_invalid",
    "policy_violation",
    "image_unavailable",
    "image_digest_mismatch",
    "protocol_ambiguous",
    "nonzero_exit",
    "oom",
    "timeout",
    "resource_exhausted",
    "missing_evidence",
    "parse_error",
    "infrastructure",
    "cancelled",
    "gpu_unavailable",
]
Stage = Literal["contract", "policy", "plan", "stage", "image", "container", "parsers", "envelope"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Failure(_Model):
    """Why the job did not succeed."""

    category: Category
    stage: Stage = Field(description="The stage of the flow where it failed.")
    retryable: bool = Field(description="Whether running the same contract again could help.")
    reason: str = Field(description="A sentence for a person: what happened and what to do.")


class ImageRecord(_Model):
    reference: str = Field(description="environment.image as the contract wrote it.")
    id: str | None = Field(description="Image id (config digest) of the image that ran.")
    repoDigest: str | None = Field(description="name@sha256 manifest digest, when known.")
    architecture: str | None = None
    os: str | None = None
    sizeBytes: int | None = None
    source: Literal["local", "pulled", "bundle"] | None = Field(
        default=None, description="Where the runner got it: already here, pulled, or a bundle."
    )


class ParserRef(_Model):
    id: str
    version: str


class EvidenceRef(_Model):
    path: str = Field(description="Relative to the job's output folder.")
    sha256: str
    size: int


class MeasurementResult(_Model):
    measurementId: str
    metric: str
    unit: str
    value: bool | int | float | str = Field(
        description="As the parser read it; numbers stay numbers, the unit is beside it."
    )
    parser: ParserRef
    evidence: EvidenceRef


class MeasurementError(_Model):
    measurementId: str
    category: Literal["missing_evidence", "parse_error"]
    reason: str


class AppliedLimits(_Model):
    """The caps applied to the container, as passed to the engine."""

    cpus: float
    memoryBytes: int
    memorySwapBytes: int
    shmBytes: int
    pidsLimit: int
    tmpfsBytes: int
    gpus: str | int
    network: str
    timeoutSeconds: float
    readOnlyRootfs: bool
    capDrop: list[str]
    securityOpt: list[str]
    init: bool
    user: str


class Timings(_Model):
    startedAt: str = Field(description="When the runner accepted the job (UTC, ISO 8601).")
    finishedAt: str
    totalSeconds: float
    stageSeconds: float | None = None
    imageSeconds: float | None = None
    runSeconds: float | None = Field(
        default=None, description="Time the job's container ran, measured by the runner."
    )
    containerStartedAt: str | None = None
    containerFinishedAt: str | None = None


class ContainerRecord(_Model):
    id: str
    name: str
    oomKilled: bool
    stoppedByRunner: bool = Field(description="True when the runner stopped it (timeout, cancel).")


class SignatureRecord(_Model):
    """Who vouched for the contract."""

    status: Literal["verified", "none"] = Field(
        description="none: the contract was unsigned and the host accepted it (local development)."
    )
    keyIds: list[str] = Field(
        description="Key ids, recomputed from the trusted keys, that verified."
    )
    payloadType: str | None
    issuedAt: str | None
    expiresAt: str | None
    audience: list[str] | None


class PolicyRecord(_Model):
    """The host policy that applied."""

    source: str = Field(description="The policy file, or 'defaults'.")
    digest: str = Field(description="sha256 of the RFC 8785 form of the effective policy.")
    maxima: dict[str, float | int | str | None]
    overrides: dict[str, float] = Field(description="Operator --limit values that tightened it.")


class GpuRecord(_Model):
    """A GPU handed to the job."""

    index: int
    uuid: str
    model: str
    memoryBytes: int
    driverVersion: str


class BudgetRecord(_Model):
    """The job's runtime budget across every attempt, from its ledger."""

    limitSeconds: float
    consumedSeconds: float = Field(description="Sum over attempts of the time the job ran.")
    remainingSeconds: float
    attempts: int = Field(description="Attempts so far, this one included.")


class ResultEnvelope(_Model):
    """The runner's account of one job."""

    schemaVersion: Literal["1.0"] = "1.0"
    kind: Literal["runner.result-envelope"] = "runner.result-envelope"
    runnerVersion: str
    jobId: str | None
    contractName: str | None = None
    contractDigest: str | None
    status: Literal["succeeded", "failed", "partial"]
    failure: Failure | None
    exitCode: int | None = Field(description="The job's own exit code; null if it never ran.")
    image: ImageRecord | None
    measurements: list[MeasurementResult]
    measurementErrors: list[MeasurementError] = Field(default_factory=list)
    limits: AppliedLimits | None
    container: ContainerRecord | None = None
    timings: Timings
    signature: SignatureRecord | None = None
    policy: PolicyRecord | None = None
    warnings: list[str] = Field(default_factory=list)
    budget: BudgetRecord | None = None
    gpus: list[GpuRecord] = Field(default_factory=list, description="GPUs given to the job.")
    gpuFallback: str | None = Field(
        default=None,
        description="Why a contract asking for GPUs ran on CPU only (it allowed a CPU fallback).",
    )
    jobDir: str | None = Field(default=None, description="Host folder holding the job's files.")
    stdoutPath: str | None = Field(default=None, description="Relative to the output folder.")
    stderrPath: str | None = None
