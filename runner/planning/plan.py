"""Contract + policy → ExecutionPlan: everything the container stage needs, decided up front.

Pure: no I/O. The plan is frozen and recorded (its limits) in the envelope, so what was applied
is what is reported.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from typing import Literal

from runner.agents import adapters as agents
from runner.backends.types import GIB, MIB, EgressPlan, HostPort, Limits
from runner.contract import VerifiedContract
from runner.contract.models import JOB_ID_PATTERN
from runner.core.errors import PolicyViolation, ProtocolAmbiguous
from runner.images.pins import ImagePin, parse_pin
from runner.planning.policy import HostPolicy, egress_granted, gpus_over_policy, isolation

__all__ = [
    "ExecutionPlan",
    "build",
    "check_command",
    "check_mode",
    "default_job_id",
    "job_id_for",
    "tightened",
]

OVERRIDABLE = ("cpus", "memoryGb", "shmGb", "pidsLimit", "timeoutMinutes", "tmpfsMb")
"""Limits the host operator may tighten from the command line (``--limit KEY=VALUE``)."""

JOB_UID = 10001
"""The uid jobs run as when the runner itself runs as root (the image's ``job`` user)."""

# The job's stdout and stderr go straight to files under /job/output: no bytes pass through the
# daemon or the runner, so capture costs nothing and memory stays bounded whatever the size.
STREAM_WRAPPER = 'exec "$@" >"$RUNNER_STDOUT" 2>"$RUNNER_STDERR"'
# An agent's stdout is its transcript, which the runner reads for its turns and cost: it stays
# the container's stdout, which the engine hands to the runner (runner.agents.transcript.Capture),
# out of the job's reach; the runner copies it to $RUNNER_STDOUT once the container has ended.
AGENT_STREAM_WRAPPER = 'exec "$@" 2>"$RUNNER_STDERR"'


@dataclass(frozen=True)
class ExecutionPlan:
    job_id: str
    contract_digest: str
    image: ImagePin
    argv: tuple[str, ...]
    """The contract's command, as the job sees it."""
    working_dir: str
    stdout_path: str
    stderr_path: str
    """Relative to the job's output folder."""
    user: str
    limits: Limits
    labels: dict[str, str] = field(default_factory=dict)
    gpu_fallback: str | None = None
    """Why a contract asking for GPUs will run on CPU only (its policy allows fewer GPUs and
    the contract allows a CPU fallback); None otherwise."""
    environment: dict[str, str] = field(default_factory=dict)
    egress: EgressPlan | None = None
    """The egress allowlist the job runs behind (``limits.network`` is then ``egress``)."""
    agent: agents.AgentPlan | None = None
    """An agent_planned contract's agent: its adapter, prompt and limits; ``argv`` is then the
    adapter's template rendered with the contract's whole limits (each attempt renders it
    with what is left)."""
    agent_image: ImagePin | None = None
    """The agent runtime's image, when the agent runs in the contract's image (``image``)
    with the runtime's files brought in from this one (runIn contract-image); None for a
    fixed entrypoint, or an adapter that runs the agent in its own image (``image`` is then
    the adapter's)."""

    @property
    def entrypoint(self) -> list[str]:
        guarded = self.agent is not None and self.agent.adapter.usage != "none"
        wrapper = AGENT_STREAM_WRAPPER if guarded else STREAM_WRAPPER
        return ["/bin/sh", "-c", wrapper, "runner-job"]


def default_job_id(contract: VerifiedContract) -> str:
    """The contract's ``jobId``, else ``<name>-<first 12 hex of the digest>``."""
    if contract.model.jobId:
        return contract.model.jobId
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", contract.model.name).strip("-.") or "job"
    return f"{name[:100]}-{contract.digest.removeprefix('sha256:')[:12]}"


def job_id_for(
    contract: VerifiedContract, requested: str | None, *, allow_override: bool = False
) -> str:
    """The job id, and so the ledger and the budget: ``--job-id`` if given, else the default.

    A signed contract's budget belongs to the contract: its job id is the one the issuer
    signed, else derived from its digest, and another ``--job-id`` (which would open a fresh
    ledger with a fresh budget) is refused unless the host policy allows overrides."""
    if requested is None:
        return default_job_id(contract)
    if not re.fullmatch(JOB_ID_PATTERN, requested):
        raise PolicyViolation(
            f"--job-id {requested!r} is not a job id: letters, digits, '_', '.', '-' "
            "(starting with a letter or digit), at most 128",
            hint="pick an id such as toy-eval-2",
        )
    own = default_job_id(contract)
    if contract.signature is not None and requested != own and not allow_override:
        whose = (
            f"the signed $.jobId {own!r}"
            if contract.model.jobId
            else f"its own job id {own!r} (derived from the contract's digest)"
        )
        raise PolicyViolation(
            f"--job-id {requested!r}: a signed contract runs under {whose}; another id would "
            "give it a fresh ledger and a fresh budget",
            hint=f"drop --job-id (or pass --job-id {own}); to run the same contract again "
            "use --rerun, which shares its budget; a host that wants overrides sets "
            "allowJobIdOverride in its policy",
        )
    return requested


def _fragment_matches(fragment: list[str], argv: tuple[str, ...]) -> bool:
    """Whether the fragment's words are consecutive argv elements (see check_command)."""

    def same(word: str, element: str) -> bool:
        return element == word or element.endswith("/" + word) or element.startswith(word + "=")

    n = len(fragment)
    return any(
        all(same(w, e) for w, e in zip(fragment, argv[i : i + n], strict=True))
        for i in range(len(argv) - n + 1)
    )


def check_mode(contract: VerifiedContract, policy: HostPolicy) -> agents.AgentPlan | None:
    """An agent_planned contract's agent plan (None for a fixed entrypoint): refused unless
    this host's policy has an adapter for its ``agent.runtime``, before anything is staged."""
    if contract.model.execution_mode != "agent_planned":
        return None
    return agents.plan_for(contract, policy.agents)


def check_command(contract: VerifiedContract) -> tuple[str, ...]:
    """The argv to run; refuse when there is none or a required fragment is missing.

    Fragments are matched against argv elements, never against the joined command: a
    fragment's words (split as a shell would) must be consecutive elements of the argv, each
    equal to its element, a path ending in it (``evaluate.py`` matches
    ``/job/input/repository/evaluate.py``), or an option given with ``=`` (``--checkpoint``
    matches ``--checkpoint=x``). A shell script (``sh -c "..."``) is one opaque element: text
    inside it does not satisfy a fragment; a contract that runs a script names the whole
    script element as its fragment."""
    protocol = contract.model.protocol
    if not protocol.command:
        raise ProtocolAmbiguous(
            "$.protocol.command: the contract names no command to run",
            hint='add "command": ["python3", "/job/input/repository/evaluate.py", ...] to protocol',
        )
    argv = tuple(protocol.command)
    missing = []
    for fragment in protocol.requiredCommandFragments:
        try:
            words = shlex.split(fragment) or [fragment]
        except ValueError:  # unbalanced quotes: one word as written
            words = [fragment]
        if not (_fragment_matches(words, argv) or _fragment_matches([fragment], argv)):
            missing.append(fragment)
    if missing:
        raise ProtocolAmbiguous(
            f"$.protocol.command: {shlex.join(argv)!r} lacks the required fragment(s) "
            + ", ".join(repr(f) for f in missing),
            hint="each entry of $.protocol.requiredCommandFragments must be whole argv "
            "elements of the command (a path may end in it; text inside a shell script does "
            "not count)",
        )
    return argv


def tightened(contract: VerifiedContract, overrides: dict[str, float]) -> dict[str, float]:
    """The contract's limits with the operator's overrides applied; an override may only
    lower a limit, never raise the signed value."""
    env = contract.model.environment
    values: dict[str, float] = {k: float(getattr(env, k)) for k in OVERRIDABLE}
    for key, value in overrides.items():
        if key not in OVERRIDABLE:
            raise PolicyViolation(
                f"--limit {key}: not a limit that can be overridden",
                hint=f"use one of {', '.join(OVERRIDABLE)}",
            )
        if not math.isfinite(value) or value > values[key] or value <= 0:
            raise PolicyViolation(
                f"--limit {key}={value:g} would loosen the contract's {values[key]:g}; "
                "an override can only tighten a limit",
                hint=f"pass a value in (0, {values[key]:g}], or drop the override",
            )
        values[key] = value
    return values


@dataclass(frozen=True)
class _Floor:
    """How one limit reaches the engine: its unit in bytes (or nanoseconds of CPU, or pids),
    and the least the engine may be given. Values are rounded down (the tighter side); one
    that rounds below the minimum is refused, since the engine reads 0 as "unlimited"."""

    unit: float
    minimum: int
    shown: str


_FLOORS = {
    "cpus": _Floor(1e9, 10_000_000, "0.01 CPU"),
    "memoryGb": _Floor(GIB, 16 * MIB, "16 MiB"),
    "shmGb": _Floor(GIB, MIB, "1 MiB"),
    "pidsLimit": _Floor(1, 16, "16 processes"),
    "tmpfsMb": _Floor(MIB, MIB, "1 MiB"),
    "diskGb": _Floor(GIB, MIB, "1 MiB"),
    "logLimitMb": _Floor(MIB, 1024, "1 KiB"),
    "timeoutMinutes": _Floor(60, 1, "1 second"),
}
"""Every limit the plan turns into a number for the engine or the runner's own guards."""


def engine_value(key: str, value: float, overrides: dict[str, float]) -> int:
    """``value`` of limit ``key`` in engine units, rounded down; refuses what would reach the
    engine (or a guard) as 0 or below the limit's minimum."""
    floor = _FLOORS[key]
    units = math.floor(value * floor.unit) if math.isfinite(value) else 0
    if units < floor.minimum:
        where = f"--limit {key}" if key in overrides else f"$.environment.{key}"
        raise PolicyViolation(
            f"{where}: {value:g} is below the least this runner applies ({floor.shown}); "
            "a cap that small would reach the engine as 0, which it reads as no cap at all",
            hint=f"ask for at least {floor.shown}",
        )
    return units


def build(
    contract: VerifiedContract,
    policy: HostPolicy,
    *,
    job_id: str,
    host_uid: int,
    host_gid: int,
    labels: dict[str, str] | None = None,
    overrides: dict[str, float] | None = None,
) -> ExecutionPlan:
    """Decide everything about the run. Raises the refusals of the protocol and image pin.

    An agent_planned contract runs its agent runtime with the host's adapter's argv, in the
    contract's environment.image (pinned and checked as any job's), the runtime's files
    brought in from the adapter's image (``agent_image``); an adapter with runIn
    adapter-image runs it in its own image instead (the contract's image is then only
    recorded). The required command fragments go to the agent in task.json instead of being
    matched."""
    agent = check_mode(contract, policy)
    env = contract.model.environment
    argv, pin, agent_image = _images(contract, policy, agent)
    lim = tightened(contract, overrides or {})
    gpus: int | Literal["none", "all"] = env.gpu
    fallback = None
    if gpus_over_policy(contract, policy):
        gpus = "none"
        fallback = (
            f"this host's policy grants at most {policy.maxima.gpus} GPU(s) and the contract "
            "allows a CPU fallback"
        )
    ov = overrides or {}
    engine_value("timeoutMinutes", lim["timeoutMinutes"], ov)  # at least a second
    memory = engine_value("memoryGb", lim["memoryGb"], ov)
    runtime = isolation(contract, policy)
    egress = _egress(contract, policy, agent)
    limits = Limits(
        cpus=engine_value("cpus", lim["cpus"], ov) / 1e9,
        memory_bytes=memory,
        memory_swap_bytes=memory,
        shm_bytes=engine_value("shmGb", lim["shmGb"], ov),
        pids=None if runtime == "runsc" else engine_value("pidsLimit", lim["pidsLimit"], ov),
        tmpfs_bytes=engine_value("tmpfsMb", lim["tmpfsMb"], ov),
        gpus=gpus,
        network=_network(env.networkAccess and agent is None, egress, agent),
        timeout_seconds=lim["timeoutMinutes"] * 60,
        runtime=runtime,
        disk_quota_bytes=engine_value("diskGb", env.diskGb or policy.maxima.diskGb, ov),
        log_limit_bytes=engine_value(
            "logLimitMb", min(env.logLimitMb or policy.logLimitMb, policy.logLimitMb), ov
        ),
        stop_on_log_limit=policy.logLimitAction == "stop",
    )
    _check_isolated_network(contract, limits)
    user = f"{JOB_UID}:{JOB_UID}" if host_uid == 0 else f"{host_uid}:{host_gid}"
    protocol = contract.model.protocol
    all_labels = {
        "org.runner.managed": "true",
        "org.runner.job-id": job_id,
        "org.runner.contract-digest": contract.digest,
        **(labels or {}),
    }
    return ExecutionPlan(
        job_id=job_id,
        contract_digest=contract.digest,
        image=pin,
        argv=argv,
        working_dir=protocol.workingDirectory,
        stdout_path=protocol.stdoutPath,
        stderr_path=protocol.stderrPath,
        user=user,
        limits=limits,
        gpu_fallback=fallback,
        labels=all_labels,
        environment=_environment(job_id, protocol.stdoutPath, protocol.stderrPath, egress, agent),
        egress=egress,
        agent=agent,
        agent_image=agent_image,
    )


def _images(
    contract: VerifiedContract, policy: HostPolicy, agent: agents.AgentPlan | None
) -> tuple[tuple[str, ...], ImagePin, ImagePin | None]:
    """(argv, the image the container runs, the agent runtime's image brought into it): the
    contract's command and image; for an agent the adapter's argv, and the contract's image
    with the runtime's from the adapter's (runIn contract-image) or the adapter's alone."""
    env = contract.model.environment
    unpinned = policy.allowUnpinnedImages
    if agent is None:
        argv = check_command(contract)
        return argv, parse_pin(env.image, env.imageId, allow_unpinned=unpinned), None
    argv = agent.argv(agent.max_turns, agent.max_budget_usd)
    adapter = agent.adapter
    adapter_pin = parse_pin(adapter.image, adapter.imageId, allow_unpinned=unpinned)
    if agent.in_contract_image:
        return argv, parse_pin(env.image, env.imageId, allow_unpinned=unpinned), adapter_pin
    return argv, adapter_pin, None


def _egress(
    contract: VerifiedContract, policy: HostPolicy, agent: agents.AgentPlan | None
) -> EgressPlan | None:
    """The allowlist the job runs behind: the pairs the contract asked for and the policy
    granted; for an agent, what its networkAccess was granted and its adapter's allow."""
    env = contract.model.environment
    allow = egress_granted(contract, policy)
    if agent is not None and env.networkAccess:
        allow = _agent_network_access(agent, policy)
    if agent is not None and agent.adapter.allow:
        # An agent reaches what its host adapter grants (its model's API), and what the
        # contract asked for and the policy granted besides; nothing else.
        allow = tuple(dict.fromkeys([*map(HostPort.parse, agent.adapter.allow), *allow]))
        if policy.egress is None:
            raise PolicyViolation(
                f"$.agent.runtime: the {agent.runtime} adapter reaches "
                f"{', '.join(agent.adapter.allow)}, and this host's policy has no egress "
                "(no upstream network for the allowlist proxy)",
                hint='give the policy "egress": {"upstreamNetwork": ...} (see the manual, '
                "docs/how-to/egress.md), or remove allow from the adapter",
            )
    if agent is not None and agent.adapter.network and not agent.adapter.allow and allow:
        raise PolicyViolation(
            f"$.environment.egress: the {agent.runtime} adapter reaches its model through the "
            f"network {agent.adapter.network}, and a container is on one network: the "
            "allowlist proxy's pairs the contract asks for could not be reached from it",
            hint="issue the contract without egress, or give the host policy's adapter allow "
            "(its model's API through the proxy) instead of network",
        )
    if not allow or policy.egress is None:
        return None
    grant = policy.egress
    return EgressPlan(allow, grant.upstreamNetwork, grant.proxyImage, tuple(grant.privateNetworks))


def _check_isolated_network(contract: VerifiedContract, limits: Limits) -> None:
    env = contract.model.environment
    if limits.runtime == "runsc" and limits.network != "none":
        field = (
            "environment.networkAccess"
            if env.networkAccess
            else "environment.egress"
            if env.egress
            else "agent.runtime"
        )
        raise PolicyViolation(
            f"$.{field}: runsc (gVisor) runs jobs with no network here; a job that needs "
            f"network ({limits.network}) runs under runc",
            hint="ask for isolation runc, or drop the network",
        )


def _environment(
    job_id: str,
    stdout: str,
    stderr: str,
    egress: EgressPlan | None,
    agent: agents.AgentPlan | None,
) -> dict[str, str]:
    """What the job is told: where its streams, budget and compute decision are, its caches,
    the proxy, and an agent's adapter env and prompt."""
    return {
        "HOME": "/tmp",  # noqa: S108 - the job's own tmpfs
        "RUNNER_JOB_ID": job_id,
        "RUNNER_STDOUT": f"/job/output/{stdout}",
        "RUNNER_STDERR": f"/job/output/{stderr}",
        "RUNNER_BUDGET_FILE": "/job/execution/runtime-budget.json",
        "RUNNER_COMPUTE_DECISION": "/job/input/compute-decision.json",
        # Caches (pip, Hugging Face, torch hub ...) land in the job's own cache folder,
        # kept across its attempts and counted in its disk quota.
        "XDG_CACHE_HOME": "/job/runtime-cache",
        "PIP_CACHE_DIR": "/job/runtime-cache/pip",
        **(egress.environment() if egress else {}),
        **({**agent.adapter.env, "RUNNER_AGENT_PROMPT": agent.prompt} if agent is not None else {}),
    }


def _agent_network_access(agent: agents.AgentPlan, policy: HostPolicy) -> tuple[HostPort, ...]:
    """An agent_planned contract's ``networkAccess: true``: what this host grants agents,
    never the open network: its adapter's allow (added by the caller) and every pair the
    policy's egress grants (package indexes, say), through the allowlist proxy; or the
    network its adapter names. Refused when the host grants agents nothing."""
    if agent.adapter.network and not agent.adapter.allow:
        # The agent reaches its model through the operator's own network; a container is on
        # one network, so the allowlist proxy's pairs could not be reached from it.
        return ()
    granted = tuple(HostPort.parse(x) for x in policy.egress.allow) if policy.egress else ()
    if not (granted or agent.adapter.allow or agent.adapter.network):
        raise PolicyViolation(
            "$.environment.networkAccess: the contract asks for network access (true); an "
            f"agent gets what this host grants agents, and it grants the {agent.runtime!r} "
            "runtime none (its adapter has no allow or network, the policy's egress.allow "
            "is empty)",
            hint='grant pairs in the host policy\'s "egress": {"allow": [...]} (a package '
            "index, say) or agents.<runtime>.allow, or issue the contract with networkAccess "
            "false",
        )
    return granted


def _network(access: bool, egress: EgressPlan | None, agent: agents.AgentPlan | None) -> str:
    """The job's network: none; the engine's bridge when the contract's network access is
    granted; ``egress`` behind the allowlist proxy (an agent's model API among its pairs);
    else, for an agent, the network its host adapter names (a host's own model gateway)."""
    if access:
        return "bridge"
    if egress is not None:
        return "egress"
    if agent is not None and agent.adapter.network:
        return agent.adapter.network
    return "none"
