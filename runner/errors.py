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
    │   ├── JobAlreadyFinished       the job id already ran to an end on this host
    │   └── JobBusy                  another runner holds this job id right now (exit 4:
    │                                its category is infrastructure; retry later)
    ├── ResourceExhausted            resource_exhausted: earlier attempts spent the budget (exit 1)
    ├── ImageUnavailable             image_unavailable: the pinned image is not here      (exit 4)
    ├── GpuUnavailable               gpu_unavailable: no GPU to give, and no CPU fallback  (exit 4)
    ├── InfrastructureError          infrastructure: the runner or the engine failed      (exit 4)
    │   ├── HostConfigError          the host's policy file or trusted keys are broken
    │   ├── EngineUnavailable        the Docker engine cannot be reached
    │   └── ContainerVanished        the job's container disappeared under us
    └── EvidenceError                the job ran, its evidence could not be read          (exit 1)
        ├── MissingEvidence          missing_evidence: the evidence file is absent
        └── EvidenceParseError       parse_error: the evidence is there but not parseable

Job outcomes that are not runner errors (non-zero exit, OOM, timeout) are not exceptions: the
orchestrator classifies them from the container's final state.
"""

from __future__ import annotations


class RunnerError(Exception):
    """Base of every error the runner raises on purpose."""

    category: str = "infrastructure"
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

    category = "policy_violation"  # subclasses name theirs; exit 3 either way (exit_family)


class ContractError(RefusedError):
    """The contract is malformed: bad JSON, a schema violation, an escaping path.

    ``path`` is the JSON path of the offending field (``$.environment.cpus``) when known.
    """

    category = "invalid_contract"

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None) -> None:
        super().__init__(f"{path}: {message}" if path else message, hint=hint)
        self.path = path


class DigestMismatch(ContractError):
    """``contractDigest`` is not the SHA-256 of the RFC 8785 form of the rest of the contract."""


class SignatureInvalid(RefusedError):
    """The DSSE envelope does not verify against this host's trusted keys and threshold."""

    category = "signature_invalid"


class PolicyViolation(RefusedError):
    """The contract asks for something the host policy does not allow."""

    category = "policy_violation"


class ProtocolAmbiguous(RefusedError):
    """The command to run is missing or does not contain every required fragment."""

    category = "protocol_ambiguous"


class ImageDigestMismatch(RefusedError):
    """The image found locally is not the image the contract pins."""

    category = "image_digest_mismatch"


class JobAlreadyFinished(RefusedError):
    """The job id already has a result envelope on this host; running it again needs intent."""

    category = "policy_violation"


class JobBusy(RefusedError):
    """Another runner on this host is running the same job id."""

    category = "infrastructure"
    retryable = True


class ResourceExhausted(RunnerError):
    """The job's budget is already spent by earlier attempts; nothing is started."""

    category = "resource_exhausted"


class GpuUnavailable(RunnerError):
    """The contract needs GPUs this host cannot give (none, too few, busy, or no driver), and
    it does not allow a CPU fallback."""

    category = "gpu_unavailable"


class ImageUnavailable(RunnerError):
    """The pinned image is not here and could not be pulled or loaded."""

    category = "image_unavailable"


class InfrastructureError(RunnerError):
    """The runner or the engine failed; the job itself is not to blame."""

    category = "infrastructure"
    retryable = True


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

    category = "missing_evidence"


class EvidenceParseError(EvidenceError):
    """The evidence file exists but the parser could not extract a valid value."""

    category = "parse_error"


REFUSALS = {
    "invalid_contract",
    "signature_invalid",
    "policy_violation",
    "protocol_ambiguous",
    "image_digest_mismatch",
}
"""Categories meaning nothing ran because the contract or the host said no (exit 3)."""


def exit_family(category: str | None) -> str:
    """The exit-code family of a failure category (None: no failure): ``succeeded``,
    ``job_failed``, ``refused``, ``infrastructure`` or ``cancelled``. One mapping for the
    envelope's exit code and for errors raised outside a run."""
    if category is None:
        return "succeeded"
    if category in REFUSALS:
        return "refused"
    if category in {"infrastructure", "image_unavailable", "gpu_unavailable"}:
        return "infrastructure"
    if category == "cancelled":
        return "cancelled"
    return "job_failed"
