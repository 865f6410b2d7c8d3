"""The runner's error tree.

Every error the runner raises on purpose is a :class:`RunnerError`. Each class carries the
failure ``category`` that ends up in the result envelope, whether a retry could help
(``retryable``), and the CLI exit code family it belongs to::

    RunnerError
    ├── RefusedError                 nothing was run: the contract or the host said no   (exit 3)
    │   ├── ContractError            invalid_contract: malformed JSON, schema, paths, digest
    │   │   └── DigestMismatch       contractDigest does not match the canonical contract
    │   ├── SignatureInvalid         signature_invalid: unsigned where signing is required, bad
    │   │                            or untrusted signature, too few distinct signers
    │   ├── PolicyViolation          policy_violation: asks for what the host does not grant
    │   ├── ProtocolAmbiguous        protocol_ambiguous: no command, or a required fragment missing
    │   ├── ImageDigestMismatch      image_digest_mismatch: the local image is not the pinned one
    │   ├── InputDigestMismatch      input_digest_mismatch: a staged input is not the one bound
    │   │                            (also input/ changed during a job: classified, not raised)
    │   ├── AssetDigestMismatch      asset_digest_mismatch: an asset's bytes are not the ones bound
    │   ├── JobAlreadyFinished       the job id already ran to an end on this host
    │   └── BundleInvalid            bundle_invalid: a bundle that cannot be made, or that does
    │                                not verify (runner job export, runner verify bundle)
    ├── JobNotFound                  job_not_found: no such job id or job folder here     (exit 5)
    ├── ResourceExhausted            resource_exhausted: the budget or an agent's is spent (exit 1)
    ├── ImageUnavailable             image_unavailable: the pinned image is not here      (exit 4)
    ├── GpuUnavailable               gpu_unavailable: no GPU to give, and no CPU fallback  (exit 4)
    ├── AssetUnavailable             asset_unavailable: an asset neither cached nor fetched (exit 4)
    ├── InfrastructureError          infrastructure: the runner or the engine failed      (exit 4)
    │   ├── JobBusy                  another runner holds this job id right now (retry later)
    │   │   └── JobFenced            another host took this runner's attempt over (it stops)
    │   ├── HostConfigError          the host's policy file or trusted keys are broken
    │   ├── EngineUnavailable        the Docker engine cannot be reached
    │   └── ContainerVanished        the job's container disappeared under us
    └── EvidenceError                the job ran, its evidence could not be read          (exit 1)
        ├── MissingEvidence          missing_evidence: the evidence file is absent
        └── EvidenceParseError       parse_error: the evidence is there but not parseable

Job outcomes that are not runner errors (non-zero exit, OOM, timeout) are not exceptions: the
orchestrator classifies them from the container's final state.

Every failure category, raised or classified, is a :class:`Category`: one table (``_TABLE``)
says per category its exit family (and so the CLI's exit code), whether it ends the job
(``final``: the same contract runs again only with ``--rerun``), whether running it again
could help (``retryable``, the default for a failure of that category) and its documentation
line. Every other table (refusals, exit codes, the batch's exit order, the envelope's schema,
the README's tables) is derived from it.
"""

from __future__ import annotations

from enum import Enum, StrEnum

__all__ = [
    "FINAL",
    "REFUSALS",
    "AssetDigestMismatch",
    "AssetUnavailable",
    "BundleInvalid",
    "Category",
    "ContainerVanished",
    "ContractError",
    "DigestMismatch",
    "EngineUnavailable",
    "EvidenceError",
    "EvidenceParseError",
    "Family",
    "GpuUnavailable",
    "HostConfigError",
    "ImageDigestMismatch",
    "ImageUnavailable",
    "InfrastructureError",
    "InputDigestMismatch",
    "JobAlreadyFinished",
    "JobBusy",
    "JobFenced",
    "JobNotFound",
    "MissingEvidence",
    "PolicyViolation",
    "ProtocolAmbiguous",
    "RefusedError",
    "ResourceExhausted",
    "RunnerError",
    "SignatureInvalid",
    "exit_family",
    "family_of",
]


class Family(Enum):
    """How a run ended, as its exit code says. In precedence order: a batch exits with the
    first family that any of its jobs ended in."""

    CANCELLED = (130, "interrupted by Ctrl-C or SIGTERM: the container was stopped and removed, "
                 "and an envelope written")  # fmt: skip
    INFRASTRUCTURE = (4, "infrastructure: the runner, the engine or the host failed; the job is "
                      "not to blame")  # fmt: skip
    REFUSED = (3, "refused before anything ran (for `runner job export` and `runner "
               "verify bundle`: a bundle that cannot be made, or that does not "
               "verify; for `runner report`: no envelope to show; `input_digest_mismatch` "
               "also after a job whose input/ changed while it ran)")  # fmt: skip
    NOT_FOUND = (5, "no such job: the job id or folder given to job status, job regrade, "
                 "verify ledger, job export, report ... is not on this host")  # fmt: skip
    JOB_FAILED = (1, "the job ran and failed (also `partial`), or its budget was already spent")
    SUCCEEDED = (0, "the job succeeded: it exited 0 and every measurement was read")

    def __init__(self, code: int, doc: str) -> None:
        self.code = code
        self.doc = doc

    @property
    def label(self) -> str:
        """``succeeded``, ``job_failed``, ``refused``, ``infrastructure``, ``cancelled``."""
        return self.name.lower()


class Category(StrEnum):
    """Why a job did not succeed. The values are the envelope's ``failure.category``."""

    INVALID_CONTRACT = "invalid_contract"
    SIGNATURE_INVALID = "signature_invalid"
    POLICY_VIOLATION = "policy_violation"
    PROTOCOL_AMBIGUOUS = "protocol_ambiguous"
    IMAGE_DIGEST_MISMATCH = "image_digest_mismatch"
    INPUT_DIGEST_MISMATCH = "input_digest_mismatch"
    ASSET_DIGEST_MISMATCH = "asset_digest_mismatch"
    IMAGE_UNAVAILABLE = "image_unavailable"
    GPU_UNAVAILABLE = "gpu_unavailable"
    ASSET_UNAVAILABLE = "asset_unavailable"
    INFRASTRUCTURE = "infrastructure"
    NONZERO_EXIT = "nonzero_exit"
    OOM = "oom"
    TIMEOUT = "timeout"
    DISK_QUOTA_EXCEEDED = "disk_quota_exceeded"
    LOG_LIMIT_EXCEEDED = "log_limit_exceeded"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    MISSING_EVIDENCE = "missing_evidence"
    PARSE_ERROR = "parse_error"
    CANCELLED = "cancelled"
    BUNDLE_INVALID = "bundle_invalid"
    JOB_NOT_FOUND = "job_not_found"

    @property
    def family(self) -> Family:
        return _TABLE[self].family

    @property
    def final(self) -> bool:
        """An attempt that ends so ends the job: running the contract again needs --rerun."""
        return _TABLE[self].final

    @property
    def retryable(self) -> bool:
        """Whether running the same contract again could help (the default; an error may say
        otherwise)."""
        return _TABLE[self].retryable

    @property
    def doc(self) -> str:
        return _TABLE[self].doc


class _Row:
    """One row of the category table (a plain class: ``runner --help`` imports this module,
    and dataclasses would bring inspect along)."""

    __slots__ = ("doc", "family", "final", "retryable")

    def __init__(self, family: Family, final: bool, retryable: bool, doc: str) -> None:
        self.family, self.final, self.retryable, self.doc = family, final, retryable, doc


_F = Family
_TABLE: dict[Category, _Row] = {
    Category.INVALID_CONTRACT: _Row(_F.REFUSED, False, False,
        "the contract is malformed: JSON, schema, digest, paths, inputs"),
    Category.SIGNATURE_INVALID: _Row(_F.REFUSED, False, False,
        "unsigned where signing is required, a bad or untrusted signature, too few signers"),
    Category.POLICY_VIOLATION: _Row(_F.REFUSED, False, False,
        "the contract asks for what this host does not grant (limits, network, registries, "
        "audience, validity, a --job-id of another contract, inputs not bound by digests)"),
    Category.PROTOCOL_AMBIGUOUS: _Row(_F.REFUSED, False, False,
        "no command, a required command fragment missing, or an agent_planned contract "
        "without its agent's runtime"),
    Category.IMAGE_DIGEST_MISMATCH: _Row(_F.REFUSED, False, False,
        "the image found is not the image the contract pins"),
    Category.INPUT_DIGEST_MISMATCH: _Row(_F.REFUSED, False, False,
        "a staged input (paper, repository) is not the one the contract binds: its digest "
        "differs (the reason names the first differing path), or the repository is not the "
        "commit the contract names; or input/ was not as staged after the job (changed on "
        "the host while it ran): the job ran on other inputs, so none of its values is a "
        "result"),
    Category.ASSET_DIGEST_MISMATCH: _Row(_F.REFUSED, False, False,
        "an asset's bytes (from a source, or unpacked) are not the ones the contract binds: "
        "its SHA-256 or size differs (the reason names the asset and both digests); nothing "
        "of it is cached or mounted"),
    Category.IMAGE_UNAVAILABLE: _Row(_F.INFRASTRUCTURE, False, True,
        "the pinned image is not here and could not be pulled or loaded"),
    Category.GPU_UNAVAILABLE: _Row(_F.INFRASTRUCTURE, False, True,
        "no GPU to give (none, too few, busy, no driver) and no CPU fallback allowed"),
    Category.ASSET_UNAVAILABLE: _Row(_F.INFRASTRUCTURE, False, True,
        "an asset is not in this host's cache and could not be fetched: fetchOnRun off, no "
        "source the policy allows, a 4xx answer, retries spent, an unsafe archive, or the "
        "cache's size limit"),
    Category.INFRASTRUCTURE: _Row(_F.INFRASTRUCTURE, False, True,
        "the runner, the engine or the host's configuration failed, or the container "
        "vanished"),
    Category.NONZERO_EXIT: _Row(_F.JOB_FAILED, True, False,
        "the job exited non-zero; `exitCode` is its own code"),
    Category.OOM: _Row(_F.JOB_FAILED, True, False,
        "the job (or a process in it) was killed for exceeding its memory cap"),
    Category.TIMEOUT: _Row(_F.JOB_FAILED, True, False,
        "the job used its whole budget (over every attempt) and was stopped"),
    Category.DISK_QUOTA_EXCEEDED: _Row(_F.JOB_FAILED, True, False,
        "the job wrote more to output/ and workspace/ than its disk quota"),
    Category.LOG_LIMIT_EXCEEDED: _Row(_F.JOB_FAILED, True, False,
        "the job's stdout or stderr passed its cap under `logLimitAction: stop`"),
    Category.RESOURCE_EXHAUSTED: _Row(_F.JOB_FAILED, True, False,
        "an agent passed `agent.maxTurns` or `agent.maxBudgetUsd` (over every attempt) and "
        "was stopped, or earlier attempts spent the budget and nothing was started"),
    Category.MISSING_EVIDENCE: _Row(_F.JOB_FAILED, False, False,
        "the job exited 0 but a measurement's evidence file is absent"),
    Category.PARSE_ERROR: _Row(_F.JOB_FAILED, False, False,
        "the evidence is there but yields no valid value"),
    Category.CANCELLED: _Row(_F.CANCELLED, False, True,
        "the runner got Ctrl-C or SIGTERM and stopped the job; running it again continues "
        "the budget"),
    Category.BUNDLE_INVALID: _Row(_F.REFUSED, False, False,
        "not a job's failure: a bundle (`runner job export`) that cannot be made, or that does "
        "not verify (`runner verify bundle`): a changed, missing or extra file, a broken ledger, "
        "values that do not re-parse"),
    Category.JOB_NOT_FOUND: _Row(_F.NOT_FOUND, False, False,
        "not a job's failure: the job id (under the state folder) or job folder a command "
        "names does not exist on this host"),
}  # fmt: skip
"""The one table of failure categories."""


class RunnerError(Exception):
    """Base of every error the runner raises on purpose."""

    category: Category = Category.INFRASTRUCTURE
    retryable: bool = False

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  fix: {self.hint}"
        return self.message


class RefusedError(RunnerError):
    """The contract or the host refused the job before anything ran."""

    category = Category.POLICY_VIOLATION  # subclasses name theirs; exit 3 either way


class ContractError(RefusedError):
    """The contract is malformed: bad JSON, a schema violation, an escaping path.

    ``path`` is the JSON path of the offending field (``$.environment.cpus``) when known.
    """

    category = Category.INVALID_CONTRACT

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None) -> None:
        super().__init__(f"{path}: {message}" if path else message, hint=hint)
        self.path = path


class DigestMismatch(ContractError):
    """``contractDigest`` is not the SHA-256 of the RFC 8785 form of the rest of the contract."""


class SignatureInvalid(RefusedError):
    """The DSSE envelope does not verify against this host's trusted keys and threshold."""

    category = Category.SIGNATURE_INVALID


class PolicyViolation(RefusedError):
    """The contract asks for something the host policy does not allow."""

    category = Category.POLICY_VIOLATION


class ProtocolAmbiguous(RefusedError):
    """The command to run is missing or does not contain every required fragment."""

    category = Category.PROTOCOL_AMBIGUOUS


class ImageDigestMismatch(RefusedError):
    """The image found locally is not the image the contract pins."""

    category = Category.IMAGE_DIGEST_MISMATCH


class InputDigestMismatch(RefusedError):
    """A staged input's digest is not the contract's, or the staged repository is not the
    commit the contract names."""

    category = Category.INPUT_DIGEST_MISMATCH


class AssetDigestMismatch(RefusedError):
    """An asset's bytes are not the ones its contract binds (SHA-256 or size)."""

    category = Category.ASSET_DIGEST_MISMATCH


class JobAlreadyFinished(RefusedError):
    """The job id already has a result envelope on this host; running it again needs intent."""

    category = Category.POLICY_VIOLATION


class BundleInvalid(RefusedError):
    """A bundle that cannot be made from this job, or that does not verify."""

    category = Category.BUNDLE_INVALID


class JobNotFound(RunnerError):
    """A command names a job (id or folder) this host does not have."""

    category = Category.JOB_NOT_FOUND


class ResourceExhausted(RunnerError):
    """The job's budget is already spent by earlier attempts; nothing is started."""

    category = Category.RESOURCE_EXHAUSTED


class GpuUnavailable(RunnerError):
    """The contract needs GPUs this host cannot give (none, too few, busy, or no driver), and
    it does not allow a CPU fallback."""

    category = Category.GPU_UNAVAILABLE


class ImageUnavailable(RunnerError):
    """The pinned image is not here and could not be pulled or loaded."""

    category = Category.IMAGE_UNAVAILABLE


class AssetUnavailable(RunnerError):
    """An asset is not in this host's cache and could not be fetched (or unpacked safely)."""

    category = Category.ASSET_UNAVAILABLE
    retryable = True


class InfrastructureError(RunnerError):
    """The runner or the engine failed; the job itself is not to blame."""

    category = Category.INFRASTRUCTURE
    retryable = True


class JobBusy(InfrastructureError):
    """Another runner on this host is running the same job id (retry later)."""


class JobFenced(JobBusy):
    """Another runner (on another host) appended to this job's ledger while this one held the
    attempt: it took the job over, so this runner removes its container and writes nothing more."""

    retryable = False


class HostConfigError(InfrastructureError):
    """This host's own configuration (policy file, trusted keys) is unreadable or invalid."""

    retryable = False


class EngineUnavailable(InfrastructureError):
    """The Docker engine could not be reached or answered with an error."""


class ContainerVanished(InfrastructureError):
    """The job's container was removed or lost while the runner was watching it."""


class EvidenceError(RunnerError):
    """The job ran, but a measurement could not be read from its evidence."""


class MissingEvidence(EvidenceError):
    """The evidence file a measurement names does not exist."""

    category = Category.MISSING_EVIDENCE


class EvidenceParseError(EvidenceError):
    """The evidence file exists but the parser could not extract a valid value."""

    category = Category.PARSE_ERROR


REFUSALS = frozenset(c for c in Category if c.family is Family.REFUSED)
"""Categories meaning nothing ran because the contract or the host said no (exit 3)."""

FINAL = frozenset(c for c in Category if c.final)
"""Categories whose attempt ends the job (besides success)."""


def exit_family(category: str | None) -> str:
    """The exit-code family of a failure category (None: no failure): ``succeeded``,
    ``job_failed``, ``refused``, ``infrastructure`` or ``cancelled``. One mapping for the
    envelope's exit code and for errors raised outside a run."""
    return family_of(category).label


def family_of(category: str | None) -> Family:
    """The :class:`Family` of a failure category (None: no failure)."""
    return Family.SUCCEEDED if category is None else Category(category).family
