"""Host policy: what this host grants, whatever a contract asks. Limits only shrink.

Long on purpose: the policy is one model of every field a host sets, each with the
description its schema publishes, and the checks that apply them to a contract.

The policy is a JSON file (``contracts/host-policy.schema.json``) found at ``--policy``, else
``$RUNNER_POLICY``, else ``<config dir>/policy.json``; without one the defaults below apply.
Maxima left null are the host's own size (CPU count, memory), resolved when the policy is
loaded so the envelope records numbers, not nulls.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Literal

import rfc8785
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from runner.agents.adapters import AgentAdapter
from runner.backends.types import HOST_PORT_PATTERN, HostPort
from runner.contract import VerifiedContract
from runner.core.errors import ContractError, HostConfigError, PolicyViolation, SignatureInvalid
from runner.images.pins import registry_of

__all__ = [
    "AssetGrant",
    "HostPolicy",
    "LoadedPolicy",
    "check",
    "cpu_fallback_allowed",
    "egress_granted",
    "gpus_over_policy",
    "isolation",
    "load",
    "refuse_expired",
    "with_switches",
]


def _both_runtimes() -> list[Literal["runc", "runsc"]]:
    return ["runc", "runsc"]


class Maxima(BaseModel):
    """The most any contract may be granted on this host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float | None = Field(default=None, gt=0, description="null: the host's CPU count.")
    memoryGb: float | None = Field(default=None, gt=0, description="null: the host's memory.")
    shmGb: float | None = Field(default=None, ge=0, description="null: half the host's memory.")
    pidsLimit: int = Field(default=32768, ge=16)
    gpus: int | Literal["all"] = Field(
        default="all", description="GPUs a job may have ('all': as many as the host has)."
    )
    timeoutMinutes: float = Field(default=1440, gt=0, description="Budget per job (24 h).")
    tmpfsMb: int = Field(default=4096, ge=1)
    diskGb: float = Field(default=100, gt=0, description="output/ + workspace/ a job may ask.")


def _network(text: str) -> str:
    """A CIDR range as ``ipaddress`` writes it; ValueError naming the fix for anything else."""
    try:
        return str(ipaddress.ip_network(text))
    except ValueError as exc:
        raise ValueError(
            f"{exc}: write a range as its network address and prefix (10.20.0.0/16, fd00::/8)"
        ) from None


class EgressGrant(BaseModel):
    """The egress allowlist this host grants: contracts may ask for these pairs, or fewer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow: list[Annotated[str, Field(pattern=HOST_PORT_PATTERN, max_length=259)]] = Field(
        default_factory=list,
        description="host:port pairs a contract's environment.egress may name (exact names, "
        "any case; an IP literal is never one).",
    )
    upstreamNetwork: str = Field(
        min_length=1,
        description="The engine network the proxy reaches them through: a bridge network with "
        "a route out, made by the operator (`docker network create runner-egress`). Only the "
        "proxy joins it, never the job.",
    )
    privateNetworks: list[Annotated[str, AfterValidator(_network)]] = Field(
        default_factory=list,
        max_length=64,
        description="Non-public address ranges (CIDR, e.g. 10.20.0.0/16) an allowed name may "
        "resolve to: an in-house mirror. The proxy resolves each allowed name itself and "
        "refuses any loopback, private, shared, link-local (a cloud's metadata service), "
        "multicast or reserved address outside these, and this host's own addresses always, "
        "so that whoever runs an allowed name's DNS cannot point it at this host or its "
        "network. A range is open to every allowed name: open the smallest.",
    )
    proxyImage: str = Field(
        default="runner-proxy:local",
        min_length=1,
        description="The proxy's image (scripts/setup.sh builds runner-proxy:local); its id is "
        "recorded in the envelope.",
    )


class AssetGrant(BaseModel):
    """Where this host fetches contracts' assets from, and how much its cache may hold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allowHosts: list[Annotated[str, Field(min_length=1, max_length=259)]] = Field(
        default_factory=list,
        description="Hosts an asset's http(s) sources may be fetched from: 'name' (any port), "
        "'name:port', or '*' for any (any case; redirects are checked too). Empty: only "
        "sources that are files beside the contract.",
    )
    cacheMaxBytes: int | None = Field(
        default=None,
        ge=0,
        description="Most the asset cache may hold (downloads and unpacked trees); a fetch "
        "that would pass it is refused (`runner cache prune` makes room). Null: no limit.",
    )
    fetchOnRun: bool = Field(
        default=False,
        description="Let `runner run` fetch an asset missing from the cache (from an allowed "
        "host). Off: the run is refused, naming the asset and `runner fetch`.",
    )
    maxUnpackedBytes: int = Field(
        default=64 * 1024**3, ge=0, description="Most one archive may unpack to (zip bombs)."
    )
    maxUnpackedFiles: int = Field(
        default=1_000_000, ge=1, description="Most files and folders one archive may hold."
    )
    retries: int = Field(
        default=5, ge=0, le=100, description="Retries of a source on 5xx, timeouts, resets."
    )

    def allows(self, host: str, port: int) -> bool:
        """Whether a source on ``host``:``port`` may be fetched from."""
        host = host.lower().rstrip(".")
        for entry in self.allowHosts:
            entry = entry.lower()
            if entry == "*" or entry == host:
                return True
            name, _, want = entry.rpartition(":")
            if name and want.isdigit() and name.strip("[]") == host and int(want) == port:
                return True
        return False


class HostPolicy(BaseModel):
    """What this host allows. The defaults are the safe ones."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schemaVersion: Literal["1.0"] = "1.0"
    acceptUnsigned: bool = Field(
        default=False,
        description="Run contracts without a DSSE signature (local development only; the "
        "envelope then says signature none).",
    )
    signatureThreshold: int = Field(default=1, ge=1, description="Distinct trusted signers.")
    audiences: list[str] = Field(
        default_factory=list,
        description="Audiences this host serves. A contract naming an audience must name one "
        "of these; a contract naming none is for any host.",
    )
    maxContractLifetimeHours: float = Field(
        default=24 * 30, gt=0, description="Longest allowed expiresAt - issuedAt."
    )
    maxima: Maxima = Field(default_factory=Maxima)
    allowNetwork: bool = Field(default=False, description="Whether network may ever be granted.")
    egress: EgressGrant | None = Field(
        default=None,
        description="The egress allowlist this host grants (null: none): a contract's "
        "environment.egress may name these host:port pairs, never others.",
    )
    allowedRegistries: list[str] = Field(
        default_factory=lambda: ["*"],
        description="Registries images may come from ('docker.io', 'localhost:5000', '*' "
        "for any). Bare image ids are local and always allowed.",
    )
    allowUnpinnedImages: bool = Field(
        default=False, description="Accept tag-only image references (local development)."
    )
    dockerConfig: str | None = Field(
        default=None,
        description="Docker config file whose credHelpers, credsStore and auths give registry "
        "credentials (default: $DOCKER_CONFIG/config.json, else ~/.docker/config.json).",
    )
    insecureRegistries: list[str] = Field(
        default_factory=list,
        description="Registries reached over plain HTTP besides loopback ones (as the engine's "
        "own insecure-registries).",
    )
    logLimitMb: float = Field(
        default=1024, gt=0, description="Cap on each of a job's stdout and stderr files."
    )
    logLimitAction: Literal["truncate", "stop"] = Field(
        default="truncate",
        description="Past the cap: keep the first and last parts and let the job run "
        "(truncate), or stop it with log_limit_exceeded (stop).",
    )
    engine: Literal["docker", "podman", "auto"] = Field(
        default="auto",
        description="The container engine jobs run on. auto: Docker when DOCKER_HOST is set "
        "or its socket exists, else Podman when CONTAINER_HOST is set or its socket for this "
        "user exists. Podman refuses a job whose caps it cannot enforce (docs/how-to/podman.md).",
    )
    isolation: Literal["runc", "runsc"] = Field(
        default="runc",
        description="The container runtime jobs get. runsc (gVisor) here is demanded: a "
        "contract asking for runc is refused.",
    )
    allowedIsolation: list[Literal["runc", "runsc"]] = Field(
        default_factory=_both_runtimes,
        description="Runtimes a contract may ask for with environment.isolation.",
    )
    maxEvidenceMb: float = Field(
        default=16384,
        gt=0,
        description="Evidence files larger than this are refused, not read; also what is hashed "
        "of the files a job's result.json lists, all together.",
    )
    maxResultKb: float = Field(
        default=1024,
        gt=0,
        description="A job's result.json larger than this is not read (it is copied into the "
        "envelope); the envelope records why.",
    )
    maxInputMb: float = Field(
        default=65536, gt=0, description="What a contract's inputs may hold together."
    )
    maxInputFiles: int = Field(
        default=100_000, ge=1, description="Files and folders a contract's inputs may hold."
    )
    allowJobIdOverride: bool = Field(
        default=False,
        description="Let --job-id give a signed contract another job id than its own (and so "
        "another budget). Off: a signed contract's job id is its jobId, else derived from its "
        "digest.",
    )
    resultSigningKey: str | None = Field(
        default=None,
        description="The runner's own Ed25519 key for signing results (default: "
        "<config>/runner-key/runner.key, made on first use).",
    )
    requireInputDigests: Literal["always", "signed", "never"] = Field(
        default="signed",
        description="Which contracts must bind each input they name (paper.path, "
        "repository.path) with a digest (paper.digest, repository.digest): always, signed "
        "contracts only, or never. A contract the rule applies to without one is refused.",
    )
    assets: AssetGrant = Field(
        default_factory=AssetGrant,
        description="Contracts' assets: the hosts they may be fetched from, the cache's size "
        "limit, and whether `runner run` fetches what is missing (docs/how-to/assets.md).",
    )
    registryRetrySeconds: float = Field(
        default=120, gt=0, description="How long transient registry failures are retried."
    )
    agents: dict[str, AgentAdapter] = Field(
        default_factory=dict,
        description="The agent runtimes this host runs for agent_planned contracts, by the "
        "name a contract gives as agent.runtime (docs/how-to/agent-runs.md). None: "
        "agent_planned contracts are refused.",
    )

    def resolved(self) -> HostPolicy:
        """The same policy with host-sized maxima filled in."""
        # The kernel's MemTotal, as psutil.virtual_memory().total reads it, without the import.
        memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
        m = self.maxima
        maxima = m.model_copy(
            update={
                "cpus": m.cpus if m.cpus is not None else float(os.cpu_count() or 1),
                "memoryGb": m.memoryGb if m.memoryGb is not None else round(memory_gb, 3),
                "shmGb": m.shmGb if m.shmGb is not None else round(memory_gb / 2, 3),
            }
        )
        return self.model_copy(update={"maxima": maxima})


@dataclass(frozen=True)
class LoadedPolicy:
    policy: HostPolicy
    source: str
    """The file it came from, or ``defaults``."""

    @property
    def digest(self) -> str:
        body = rfc8785.dumps(self.policy.model_dump(mode="json"))
        return "sha256:" + hashlib.sha256(body).hexdigest()


def load(path: Path | None) -> LoadedPolicy:
    """Read the policy file at ``path`` (None: the defaults), with host maxima resolved."""
    if path is None:
        return LoadedPolicy(HostPolicy().resolved(), "defaults")
    from runner.contract.load import parse_json, validation_error
    from runner.core.safefs import UnsafePath, read_named

    try:
        raw = read_named(path, 1024 * 1024)
    except (OSError, UnsafePath) as exc:
        why = exc.problem if isinstance(exc, UnsafePath) else exc.strerror
        raise HostConfigError(
            f"cannot read the host policy {path}: {why}",
            hint="fix --policy / RUNNER_POLICY, or remove it to use the defaults",
        ) from exc
    try:
        policy = HostPolicy.model_validate(parse_json(raw, str(path)))
    except ContractError as exc:
        raise HostConfigError(f"host policy {path}: {exc.message}", hint=exc.hint) from exc
    except ValidationError as exc:
        err = validation_error(exc, "host policy")
        raise HostConfigError(
            f"host policy {path}: {err.message}",
            hint="see contracts/host-policy.schema.json",
        ) from exc
    return LoadedPolicy(policy.resolved(), str(path))


def with_switches(
    loaded: LoadedPolicy, *, network: bool, unsigned: bool, unpinned: bool
) -> LoadedPolicy:
    """The host operator's command-line switches, applied on top of the policy file."""
    update = {}
    if network:
        update["allowNetwork"] = True
    if unsigned:
        update["acceptUnsigned"] = True
    if unpinned:
        update["allowUnpinnedImages"] = True
    if not update:
        return loaded
    return LoadedPolicy(loaded.policy.model_copy(update=update), loaded.source + " + switches")


def _over(field: str, asked: float | int | str, maximum: float | int | str) -> PolicyViolation:
    return PolicyViolation(
        f"$.environment.{field}: the contract asks for {asked}, this host allows at most {maximum}",
        hint=f"issue the contract with {field} <= {maximum}, or run it on a host whose policy "
        "allows more",
    )


def check(
    contract: VerifiedContract, policy: HostPolicy, now: datetime, *, check_times: bool = True
) -> None:
    """Refuse what the contract asks and the host does not grant. ``check_times`` is False when
    resuming a job this host already accepted (its contract may have expired since)."""
    m = contract.model
    if contract.signature is None and not policy.acceptUnsigned:
        raise SignatureInvalid(
            "the contract is not signed and this host runs only signed contracts",
            hint="sign it (`runner sign CONTRACT --key KEY`), or for local development pass "
            "--allow-unsigned (RUNNER_ALLOW_UNSIGNED=1)",
        )
    if check_times:
        _check_times(contract, policy, now)
    _check_input_digests(contract, policy)
    if m.audience and not set(m.audience) & set(policy.audiences):
        raise PolicyViolation(
            f"$.audience: the contract is for {', '.join(m.audience)}; this host serves "
            f"{', '.join(policy.audiences) or 'no named audience'}",
            hint="run it on a host of that audience, or add the audience to the policy's "
            "'audiences'",
        )
    env = m.environment
    mx = policy.resolved().maxima
    for field, asked, maximum in (
        ("cpus", env.cpus, _resolved(mx.cpus)),
        ("memoryGb", env.memoryGb, _resolved(mx.memoryGb)),
        ("shmGb", env.shmGb, _resolved(mx.shmGb)),
        ("pidsLimit", env.pidsLimit, mx.pidsLimit),
        ("timeoutMinutes", env.timeoutMinutes, mx.timeoutMinutes),
        ("tmpfsMb", env.tmpfsMb, mx.tmpfsMb),
    ):
        if asked > maximum:
            raise _over(field, asked, maximum)
    if env.diskGb is not None and env.diskGb > mx.diskGb:
        raise _over("diskGb", env.diskGb, mx.diskGb)
    if env.logLimitMb is not None and env.logLimitMb > policy.logLimitMb:
        raise _over("logLimitMb", env.logLimitMb, policy.logLimitMb)
    isolation(contract, policy)
    if gpus_over_policy(contract, policy) and not cpu_fallback_allowed(contract):
        raise _over("gpu", env.gpu, mx.gpus if mx.gpus else "none")
    agent_planned = contract.model.execution_mode == "agent_planned"
    if env.networkAccess and not policy.allowNetwork and not agent_planned:
        # An agent's networkAccess is what the host grants agents (runner.planning.plan), never the
        # open network.
        raise PolicyViolation(
            "$.environment.networkAccess: the contract asks for network access (true) and this "
            "host never grants it",
            hint="issue the contract with networkAccess false, or run it on a host whose policy "
            "sets allowNetwork (or that passes --allow-network)",
        )
    egress_granted(contract, policy)
    registry = registry_of(env.image)
    allowed = policy.allowedRegistries
    if registry is not None and "*" not in allowed and registry not in allowed:
        raise PolicyViolation(
            f"$.environment.image: {env.image} comes from the registry {registry}, which this "
            f"host does not allow (allowed: {', '.join(allowed) or 'none'})",
            hint="use an image from an allowed registry, or add it to 'allowedRegistries'",
        )


def _check_input_digests(contract: VerifiedContract, policy: HostPolicy) -> None:
    """Refuse a contract that names an input without binding it by a digest, where the policy
    requires digests (by default: of signed contracts)."""
    rule = policy.requireInputDigests
    if rule == "never" or (rule == "signed" and contract.signature is None):
        return
    m = contract.model
    if m.agent is not None and m.agent.promptPath is not None and m.agent.promptDigest is None:
        raise PolicyViolation(
            f"$.agent.promptDigest: the contract names agent.promptPath {m.agent.promptPath!r} "
            f"without a digest (requireInputDigests: {rule})",
            hint="fill the digests in with `runner pin CONTRACT` (or `runner sign`)",
        )
    for name, obj in (("paper", m.paper), ("repository", m.repository)):
        if obj is not None and obj.path is not None and obj.digest is None:
            which = "any contract" if rule == "always" else "a signed contract"
            raise PolicyViolation(
                f"$.{name}.digest: the contract names {name}.path {obj.path!r} without a digest; "
                f"this host runs {which} only when every input it names is bound by its digest "
                f"(requireInputDigests: {rule})",
                hint="fill the digests in with `runner pin CONTRACT` (or `runner sign`, which "
                "does so before signing) and sign the contract again",
            )


def egress_granted(contract: VerifiedContract, policy: HostPolicy) -> tuple[HostPort, ...]:
    """The pairs the contract's ``environment.egress`` asks for, each granted by the policy
    (never more than it asks); refuses a pair the policy does not grant."""
    env = contract.model.environment
    if env.egress is None:
        return ()
    if env.networkAccess:
        raise PolicyViolation(
            "$.environment.egress: the contract asks for the full network (networkAccess true) "
            "and for an egress allowlist; one of them would be ignored",
            hint="drop networkAccess to run behind the allowlist, or drop egress",
        )
    grant = policy.egress
    granted = {HostPort.parse(x) for x in grant.allow} if grant else set()
    asked = []
    for i, text in enumerate(env.egress):
        pair = HostPort.parse(text)
        if pair not in granted:
            raise PolicyViolation(
                f"$.environment.egress[{i}]: the contract asks to reach {pair}; this host "
                + (
                    f"grants egress to {', '.join(sorted(map(str, granted)))} only"
                    if granted
                    else "grants no egress"
                ),
                hint=f"issue the contract without {pair}, or run it on a host whose policy "
                "lists it in egress.allow",
            )
        if pair not in asked:
            asked.append(pair)
    return tuple(asked)


def isolation(contract: VerifiedContract, policy: HostPolicy) -> Literal["runc", "runsc"]:
    """The runtime the job gets; refuses a request the policy does not allow."""
    asked = contract.model.environment.isolation
    if asked is None:
        return policy.isolation
    if policy.isolation == "runsc" and asked == "runc":
        raise PolicyViolation(
            "$.environment.isolation: the contract asks for runc; this host demands runsc (gVisor)",
            hint="drop the request, or run it on a host whose policy allows runc",
        )
    if asked not in policy.allowedIsolation:
        raise PolicyViolation(
            f"$.environment.isolation: the contract asks for {asked}; this host allows "
            f"{', '.join(policy.allowedIsolation)}",
            hint="drop the request, or run it on a host that allows it",
        )
    return asked


def cpu_fallback_allowed(contract: VerifiedContract) -> bool:
    req = contract.model.computeRequirement
    return bool(req and req.cpuFallbackAllowed)


def gpus_over_policy(contract: VerifiedContract, policy: HostPolicy) -> bool:
    """Whether the contract asks for more GPUs than the policy grants."""
    asked, most = contract.model.environment.gpu, policy.maxima.gpus
    if asked == "none" or most == "all":
        return False
    return most == 0 or asked == "all" or (isinstance(asked, int) and asked > most)


def _resolved(value: float | None) -> float:
    if value is None:
        raise ValueError("policy maxima are resolved before use")
    return value


def refuse_expired(contract: VerifiedContract, now: datetime, *, what: str = "") -> None:
    """Refuse a contract past its ``expiresAt``: nothing new starts under it (a job this host
    accepted earlier may still be reattached to, recovered or shown)."""
    m = contract.model
    if m.expiresAt is not None and m.expiresAt <= now:
        raise PolicyViolation(
            f"$.expiresAt: the contract expired at {m.expiresAt.isoformat()} "
            f"(now {now.isoformat(timespec='seconds')}){what}",
            hint="ask the issuer for a fresh contract (`runner sign` stamps a new expiry)",
        )


def _check_times(contract: VerifiedContract, policy: HostPolicy, now: datetime) -> None:
    m = contract.model
    if m.issuedAt is not None and m.issuedAt > now + timedelta(minutes=5):
        raise PolicyViolation(
            f"$.issuedAt: the contract is not valid before {m.issuedAt.isoformat()} "
            f"(now {now.isoformat(timespec='seconds')})",
            hint="check the clocks of the issuer and this host",
        )
    refuse_expired(contract, now)
    if contract.signature is not None and m.expiresAt is None:
        raise PolicyViolation(
            "$.expiresAt: a signed contract must say when it expires",
            hint="sign it with `runner sign`, which stamps issuedAt and expiresAt",
        )
    if m.expiresAt is not None:
        start = m.issuedAt if m.issuedAt is not None else now
        hours = (m.expiresAt - start).total_seconds() / 3600
        if hours > policy.maxContractLifetimeHours:
            raise PolicyViolation(
                f"$.expiresAt: the contract lives {hours:.1f} h, this host accepts at most "
                f"{policy.maxContractLifetimeHours:g} h",
                hint="re-sign with a shorter --expires-in",
            )
