"""Long on purpose: the envelope is one document, and its models stay together so that the
schema generated from them (and the README's field table) reads in one place.

The result envelope: what happened, in a form anyone can check.

``contracts/result-envelope.schema.json`` is generated from these models; they hold no
logic beyond their fields. The envelope is built from a run's parts by
:mod:`runner.results.envelope`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runner.backends.types import ENGINE_TEXT_MAX, GpuInjection
from runner.core.errors import Category
from runner.models.resources import AttemptResources, ResourceTotals

__all__ = [
    "AgentLimits",
    "AgentPromptRecord",
    "AgentRecord",
    "AgentResultFlag",
    "AgentResultRecord",
    "AgentRuntimeRecord",
    "AgentUsageAttempt",
    "AgentUsageRecord",
    "Allocation",
    "AppliedLimits",
    "AttemptRecord",
    "BudgetRecord",
    "ContainerRecord",
    "DiskRecord",
    "EgressConnection",
    "EgressRecord",
    "EngineRecord",
    "EvidenceRef",
    "Failure",
    "FileRef",
    "GpuRecord",
    "ImageRecord",
    "InputRecord",
    "Material",
    "MeasurementError",
    "MeasurementResult",
    "ParserRef",
    "PolicyRecord",
    "RecordFile",
    "Regrade",
    "ResultEnvelope",
    "SignatureRecord",
    "Stage",
    "Status",
    "Timings",
]

Status = Literal["succeeded", "failed", "partial"]
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
    reference: str = Field(
        description="environment.image as the contract wrote it: the image the job (an "
        "agent and its commands included) ran in; for an agent adapter with runIn "
        "adapter-image, the adapter's image (the contract's is in agent.contractImage)."
    )
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
    attempt: int | None = Field(
        default=None,
        description="The attempt that wrote the file as it was read (from each attempt's "
        "output manifest); null when none recorded it so.",
    )


class FileRef(_Model):
    """A file under the job's output folder, hashed."""

    path: str = Field(description="Relative to the job's output folder.")
    exists: bool = True
    sha256: str | None = None
    size: int | None = None
    problem: str | None = Field(default=None, description="Why it could not be hashed.")
    droppedBytes: int = Field(
        default=0, description="Bytes cut from the middle of a log past its cap."
    )
    attempt: int | None = Field(
        default=None, description="The attempt that wrote it (see EvidenceRef.attempt)."
    )


class AgentResultFlag(_Model):
    """One disagreement the runner found between the job's result.json and the contract, the
    job's files or the runner's own verdict (codes: docs/concepts/evidence.md, "The job's
    result.json")."""

    code: str = Field(description="Stable, machine-readable: what disagrees.")
    path: str = Field(description="JSON path in result.json of the entry concerned, e.g. $.x.")
    message: str = Field(description="A sentence for a person.")


class AgentResultRecord(_Model):
    """The job's own result.json: its claim, kept apart from the runner's verdict."""

    valid: bool = Field(description="Read, schema-valid, and nothing in it was flagged.")
    problems: list[str] = Field(
        default_factory=list, description="Why it could not be read or fails its schema."
    )
    flags: list[AgentResultFlag] = Field(
        default_factory=list, description="Every disagreement found in a schema-valid one."
    )
    claim: dict[str, Any] | None = Field(
        default=None, description="The result.json content, when it parsed against its schema."
    )
    file: FileRef
    listed: list[FileRef] = Field(
        default_factory=list, description="The evidence and output files it lists, hashed."
    )


class Regrade(_Model):
    """How this envelope revision re-read stored evidence without running anything."""

    at: str
    parserVersions: Literal["recorded", "latest"]
    changes: list[str] = Field(default_factory=list, description="Parser versions that changed.")


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
    category: Category = Field(description="missing_evidence or parse_error.")
    reason: str


class AppliedLimits(_Model):
    """The caps applied to the container, as passed to the engine."""

    cpus: float
    memoryBytes: int
    memorySwapBytes: int
    shmBytes: int
    pidsLimit: int | None = Field(
        description="null under runsc, where the job's processes are gVisor tasks bounded by "
        "the memory cap, not host processes."
    )
    tmpfsBytes: int
    gpus: str | int
    network: str
    timeoutSeconds: float
    readOnlyRootfs: bool
    capDrop: list[str]
    securityOpt: list[str]
    init: bool
    user: str
    runtime: str = Field(default="runc", description="runc, or runsc (gVisor).")
    diskQuotaBytes: int | None = None
    logLimitBytes: int | None = None
    logLimitAction: str | None = None


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


_ENGINE_TEXT = r"^[ -~]*$"
"""Printable ASCII: what :func:`runner.backends.types.engine_text` keeps of an engine's word."""


class EngineRecord(_Model):
    """The container engine that ran the job's container, as it names itself (printable ASCII,
    cut short: an engine's word is a record, never trusted for more)."""

    name: str = Field(
        max_length=ENGINE_TEXT_MAX, pattern=_ENGINE_TEXT, description="docker or podman."
    )
    version: str = Field(
        max_length=ENGINE_TEXT_MAX,
        pattern=_ENGINE_TEXT,
        description="The engine's version (its /version answer).",
    )
    apiVersion: str = Field(
        max_length=ENGINE_TEXT_MAX,
        pattern=_ENGINE_TEXT,
        description="The API version the engine answered with.",
    )


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
    injection: GpuInjection | None = Field(
        default=None,
        description="How it reached the container: cdi-native (the engine applied the CDI "
        "spec), cdi-applied (the runner applied it: device node, read-only driver libraries, "
        "environment), nvidia-runtime (the engine's NVIDIA runtime); null in envelopes written "
        "before it was recorded.",
    )
    cdiDevice: str | None = Field(
        default=None, description="Its CDI name (nvidia.com/gpu=...); null under nvidia-runtime."
    )


class DiskRecord(_Model):
    """What output/ and workspace/ held, against the quota."""

    quotaBytes: int
    usedBytes: int = Field(description="At the end (allocated bytes, sparse files as allocated).")
    peakBytes: int = Field(description="The most measured while the job ran.")
    measurements: int = Field(description="How many times usage was measured while it ran.")


class AgentLimits(_Model):
    """An agent's limits as an attempt was given them: what was left of the contract's."""

    runtime: str
    maxTurns: int | None = Field(description="Turns left for this attempt; null: no limit.")
    maxBudgetUsd: float | None = Field(description="USD left for this attempt; null: no limit.")
    turnsUsed: int = Field(description="Turns of the earlier attempts.")
    costUsdUsed: float = Field(description="USD of the earlier attempts.")


class Allocation(_Model):
    """What the runner actually gave an attempt: written for the job as
    ``/job/input/compute-decision.json`` before it starts, and kept in the envelope."""

    schemaVersion: Literal["1.0"] = "1.0"
    jobId: str
    attempt: int = Field(description="The attempt this allocation was made for (1, 2 ...).")
    accelerator: Literal["gpu", "cpu"] = Field(description="gpu when GPUs were handed out.")
    cpus: float
    memoryBytes: int
    shmBytes: int
    pidsLimit: int | None
    tmpfsBytes: int
    diskQuotaBytes: int = Field(description="What the job's writable folders may hold together.")
    gpus: list[GpuRecord] = Field(description="GPUs by index and UUID; [] on CPU.")
    cpuFallback: str | None = Field(
        description="Why a contract asking for GPUs runs on CPU only (it allowed a fallback)."
    )
    runtime: str = Field(description="The container runtime: runc, or runsc (gVisor).")
    network: str = Field(
        description="none: no network at all; egress: only the allowlist, through the proxy."
    )
    budgetLimitSeconds: float = Field(description="The job's budget across every attempt.")
    budgetRemainingSeconds: float = Field(description="What was left when this attempt started.")
    agent: AgentLimits | None = Field(
        default=None, description="An agent_planned run's agent limits for this attempt."
    )


class RecordFile(_Model):
    """A file the runner kept of an attempt, relative to the job folder, hashed."""

    path: str = Field(description="Relative to the job folder, e.g. record/attempts/1/...")
    sha256: str | None
    size: int


class AttemptRecord(_Model):
    """One attempt of the job, from its ledger, with the files kept of it."""

    attempt: int
    classification: str | None = Field(description="How it ended; null while in flight.")
    seconds: float = Field(description="Its share of the budget.")
    how: str | None = Field(
        description="observed, recovered, reattached, vanished, never-started, host-lost ..."
    )
    host: str | None = Field(
        default=None, description="The host that ran it (null: recorded before hosts were)."
    )
    files: list[RecordFile] = Field(
        description="record/attempts/<n>/: container state, engine log, output manifest, and "
        "its stdout and stderr once a later attempt started (never truncated or replaced)."
    )
    resources: AttemptResources | None = Field(
        default=None,
        description="What its container used (CPU, memory, I/O, pids), from the engine's "
        "counters sampled while it ran; null: not sampled (off, or no runner watched it).",
    )


class AgentUsageAttempt(_Model):
    """One attempt's agent usage, as the ledger's agent.usage event records it."""

    attempt: int
    turns: int = Field(description="Model turns: the model's answers in the runner's "
                       "capture of the agent's stdout, or the model requests the egress "
                       "proxy counted when more.")  # fmt: skip
    costUsd: float = Field(description="The runtime's reported cost, or the runner's estimate "
                           "from token usage and the adapter's prices when higher.")  # fmt: skip
    reportedTurns: int | None = Field(default=None, description="The runtime's own num_turns.")
    reportedCostUsd: float | None = Field(
        default=None, description="The runtime's own total_cost_usd."
    )
    requests: int | None = Field(
        default=None, description="Model requests counted by the egress proxy; null: not counted."
    )
    stoppedFor: str | None = Field(
        default=None,
        description="agent.maxTurns or agent.maxBudgetUsd when the attempt ended at that "
        "limit; agent.transcript when the runner stopped it because its usage could no longer "
        "be read (fail closed).",
    )


class AgentUsageRecord(_Model):
    """An agent's usage against the contract's limits, cumulative over every attempt like the
    wall-time budget (from the ledger)."""

    source: str = Field(description="How usage was read: claude-code (the stream-json "
                        "transcript), or none.")  # fmt: skip
    maxTurns: int | None = Field(description="The contract's limit (or the host's cap).")
    maxBudgetUsd: float | None = Field(description="The contract's limit (or the host's cap).")
    turns: int = Field(description="Over every attempt.")
    costUsd: float = Field(description="Over every attempt.")
    requests: int | None = Field(
        default=None, description="Model requests over every attempt, counted by the proxy."
    )
    attempts: list[AgentUsageAttempt] = Field(default_factory=list)


class AgentRuntimeRecord(_Model):
    """The agent runtime brought into the contract's image (runIn contract-image)."""

    image: ImageRecord = Field(description="The runtime's image, as acquired and verified.")
    paths: list[str] = Field(description="The adapter's runtimePaths, copied out of it.")
    mountedAt: str = Field(description="Where its files were, read-only, in the container.")
    filesDigest: str = Field(
        description="sha256 of the canonical list of its files (path, sha256, size, mode)."
    )
    files: list[dict[str, Any]] = Field(description="Each file: path, sha256, size.")


class AgentPromptRecord(_Model):
    """The prompt the runner staged for a contract that names none (agent.promptPath)."""

    path: str = Field(description="Where it lay in /job/input.")
    sha256: str
    source: Literal["host", "default"] = Field(
        description="host: the adapter's prompts file for the mode; default: the runner's."
    )
    hostFile: str | None = None


class AgentRecord(_Model):
    """The agent of an agent_planned run, as the host's adapter ran it."""

    runtime: str = Field(description="agent.runtime: the adapter that ran it.")
    image: str = Field(description="The adapter's image: the runtime's.")
    contractImage: str = Field(description="The contract's environment.image, as written.")
    runIn: Literal["contract-image", "adapter-image"] = Field(
        default="adapter-image",
        description="Where the agent's commands ran: the contract's image (its runtime "
        "brought in, agentRuntime), or the adapter's own.",
    )
    commandsImageId: str | None = Field(
        default=None,
        description="The image id the agent and every command it ran were in (image.id).",
    )
    agentRuntime: AgentRuntimeRecord | None = Field(
        default=None, description="The runtime brought into the contract's image."
    )
    argv: list[str] = Field(description="The argv of the attempt that produced this result.")
    prompt: str = Field(description="The prompt file in the container.")
    promptSource: Literal["contract", "host", "default"] = Field(
        default="contract",
        description="contract: agent.promptPath, an input; host or default: see hostPrompt.",
    )
    hostPrompt: AgentPromptRecord | None = None
    transcript: str = Field(
        description="The agent's stream (its stdout), relative to the output folder; hashed "
        "in logs, each earlier attempt's kept under record/attempts/<n>/streams/."
    )
    allow: list[str] = Field(
        description="host:port pairs the agent could reach through the allowlist proxy: its "
        "adapter's, and what the contract's egress or networkAccess was granted."
    )
    network: str = Field(description="The network its container had.")


class InputRecord(_Model):
    """An input the contract names, as staged."""

    field: str = Field(description="$.paper.path or $.repository.path.")
    path: str = Field(description="Where it lies in /job/input.")
    digest: str = Field(description="Its digest (sha256 of a file; runner-tree-v1 of a folder).")


class Material(_Model):
    """Something the result was made from, as an in-toto ResourceDescriptor."""

    name: str = Field(description="contract:<name>, input/<path>, image:<reference> or asset:<id>.")
    digest: dict[str, str] = Field(description="{'sha256': hex}.")
    annotations: dict[str, str] = Field(default_factory=dict)


class EgressConnection(_Model):
    """One request the job made of the egress proxy, as the proxy's log tells it."""

    at: str | None = Field(description="When the proxy read it (the engine's log time, UTC).")
    method: str = Field(description="CONNECT for a tunnel (TLS), else the HTTP method.")
    target: str = Field(description="What the job asked for: host:port, or the URL.")
    host: str | None = Field(description="The host the proxy would connect to.")
    port: int | None
    address: str | None = Field(
        default=None, description="The address the proxy connected to (it resolved the name)."
    )
    decision: Literal["allowed", "refused", "incomplete"] = Field(
        description="allowed: on the allowlist, so the proxy connected onward (or tried); "
        "refused: answered with an error, nothing sent onward; incomplete: the request never "
        "ended (the client gave up) or its end is not in the kept log."
    )
    detail: str = Field(
        description="connected, unreachable; not on the allowlist, port not allowed, "
        "resolves to a non-public address: ADDRESS, lease ended, bad request, not an HTTP "
        "proxy request, too many connections; no outcome."
    )


class EgressRecord(_Model):
    """What the job was allowed to reach, and every connection it asked the proxy for."""

    allow: list[str] = Field(description="The host:port pairs the proxy let through.")
    upstreamNetwork: str = Field(description="The engine network the proxy reached them on.")
    privateNetworks: list[str] = Field(
        default_factory=list,
        description="Non-public address ranges the host let an allowed name resolve to "
        "(the policy's egress.privateNetworks); any other non-public address was refused.",
    )
    proxyImage: str = Field(description="The proxy's image id.")
    network: str = Field(description="The job's own network (internal: no way out).")
    allowed: int = Field(
        description="Connections the proxy made (or tried) for the job: every one, those "
        "past the log's cap included when the proxy's tally of them was read."
    )
    refused: int = Field(description="Requests it refused (counted as allowed is).")
    incomplete: int = Field(description="Requests with no outcome (counted as allowed is).")
    connections: list[EgressConnection] = Field(
        description="Each request, in the order the proxy read them (the first 1,000)."
    )
    connectionsDropped: int = Field(default=0, description="Requests past the first 1,000.")
    log: str = Field(description="The proxy's log, relative to the job folder.")
    logTruncated: bool = Field(
        default=False,
        description="The log reached its cap: later requests are not listed, and are counted "
        "only when problems does not say the proxy's tally is missing.",
    )
    problems: list[str] = Field(
        default_factory=list, description="What went wrong taking it down, if anything."
    )


class BudgetRecord(_Model):
    """The job's runtime budget across every attempt, from its ledger."""

    limitSeconds: float
    consumedSeconds: float = Field(description="Sum over attempts of the time the job ran.")
    remainingSeconds: float
    attempts: int = Field(description="Attempts so far, this one included.")


class ResultEnvelope(_Model):
    """The runner's account of one job."""

    schemaVersion: Literal["1.0"] = Field(default="1.0", description="This format's version.")
    kind: Literal["runner.result-envelope"] = Field(
        default="runner.result-envelope", description="What this document is."
    )
    runnerVersion: str = Field(description="The runner that wrote it.")
    jobId: str | None = Field(description="The job; null when refused before it had one.")
    contractName: str | None = Field(default=None, description="The contract's `name`.")
    contractDigest: str | None = Field(
        description="sha256 (RFC 8785) of the contract that ran: the issuer's own "
        "contractDigest, which the runner recomputed and found equal."
    )
    status: Status = Field(
        description="partial: the job exited 0 and some, not all, measurements were read."
    )
    failure: Failure | None = Field(
        description="null on success; else category, stage, retryable and a reason."
    )
    exitCode: int | None = Field(description="The job's own exit code; null if it never ran.")
    image: ImageRecord | None = Field(
        description="Reference, image id, repo digest, platform, size and where it came from."
    )
    measurements: list[MeasurementResult] = Field(
        description="Each value with its parser (id, version) and its evidence (path, sha256)."
    )
    measurementErrors: list[MeasurementError] = Field(
        default_factory=list, description="Measurements that could not be read, and why."
    )
    limits: AppliedLimits | None = Field(description="The caps applied to the container.")
    engine: EngineRecord | None = Field(
        default=None,
        description="The engine that ran that attempt's container: docker or podman, its "
        "version (null: refused before an engine was asked, or an envelope older than this "
        "record).",
    )
    container: ContainerRecord | None = Field(
        default=None, description="The container of the attempt that produced this result."
    )
    timings: Timings = Field(description="Runner start and end; staging, image, run seconds.")
    signature: SignatureRecord | None = Field(
        default=None, description="Who signed the contract (or `none`), and its validity."
    )
    policy: PolicyRecord | None = Field(
        default=None, description="The host policy that applied: source, digest, maxima."
    )
    warnings: list[str] = Field(
        default_factory=list, description="Things a reader must know (unsigned, CPU fallback...)."
    )
    budget: BudgetRecord | None = Field(
        default=None, description="The runtime budget across every attempt, from the ledger."
    )
    logs: list[FileRef] = Field(default_factory=list, description="stdout and stderr, hashed.")
    agentResult: AgentResultRecord | None = Field(
        default=None, description="The job's own /job/output/result.json, if it wrote one."
    )
    revision: int = Field(default=1, description="1 from the run; +1 for each `runner parse`.")
    regrade: Regrade | None = Field(
        default=None, description="How a `runner parse` revision re-read the evidence."
    )
    disk: DiskRecord | None = Field(
        default=None, description="Disk used by output/ and workspace/ against the quota."
    )
    gpus: list[GpuRecord] = Field(default_factory=list, description="GPUs given to the job.")
    gpuFallback: str | None = Field(
        default=None,
        description="Why a contract asking for GPUs ran on CPU only (it allowed a CPU fallback).",
    )
    inputs: list[InputRecord] = Field(
        default_factory=list, description="The inputs staged for the job, with their digests."
    )
    inputsUnchanged: bool | None = Field(
        default=None,
        description="Whether input/ was, after the job, exactly as staged (re-hashed, no link "
        "followed); false makes the run failed with input_digest_mismatch, its reason naming "
        "the first change; null: not checked.",
    )
    jobDir: str | None = Field(default=None, description="Host folder holding the job's files.")
    materials: list[Material] = Field(
        default_factory=list,
        description="What the result was made from, by digest: the contract, every input, "
        "the image, an agent runtime's image and every asset mounted (in-toto "
        "ResourceDescriptors; the signed statement "
        "carries them).",
    )
    research: dict[str, Any] | None = Field(
        default=None,
        description="The contract's research ids (workId, claimId, experimentId ...), as given.",
    )
    attempt: int | None = Field(
        default=None, description="The attempt that produced this result (1, 2 ...)."
    )
    allocation: Allocation | None = Field(
        default=None,
        description="What that attempt was given (its /job/input/compute-decision.json).",
    )
    attempts: list[AttemptRecord] = Field(
        default_factory=list, description="Every attempt so far, from the ledger, with its files."
    )
    resources: ResourceTotals | None = Field(
        default=None,
        description="What every sampled attempt used together: CPU and I/O summed, the "
        "peaks the most (null: no attempt was sampled).",
    )
    stdoutPath: str | None = Field(
        default=None, description="The job's stdout file, relative to the output folder."
    )
    stderrPath: str | None = Field(
        default=None, description="The job's stderr file, relative to the output folder."
    )
    egress: EgressRecord | None = Field(
        default=None,
        description="The egress allowlist the job ran behind: its connections, allowed and "
        "refused, counted (null: it had none).",
    )
    agent: AgentRecord | None = Field(
        default=None,
        description="An agent_planned run's agent: runtime, where its commands ran (runIn, "
        "commandsImageId), the runtime's image and files brought in, argv, prompt, transcript.",
    )
    agentUsage: AgentUsageRecord | None = Field(
        default=None,
        description="An agent_planned run's turns and cost against its limits, per attempt and "
        "over every attempt.",
    )
