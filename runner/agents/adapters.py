"""Agent adapters: how this host runs an agent_planned contract's agent runtime.

The host policy's ``agents`` maps a runtime name (a contract's ``agent.runtime``) to an
:class:`AgentAdapter`: the pinned image the runtime comes from (its files brought into the
contract's image, :mod:`runner.execution.agentimage`, or the image it runs in), the argv template
that
starts it, the environment and the secrets the host injects, the hosts it may reach, how its
usage is read, and the host's own caps on its turns and cost. The contract chooses the
runtime and its limits; the host decides which runtimes exist. An :class:`AgentPlan` is the
adapter applied to one contract: the argv is rendered per attempt with what is left of the
turn and cost limits after the earlier attempts.

Secrets reach the agent's container as environment variables only: they are read when an
attempt starts (:func:`secret_values`), handed to the engine, and never written by the runner
into the job folder, the ledger, the envelope or a bundle; :mod:`runner.core.redaction` scrubs
them, in their usual encodings, from everything the runner keeps, signs or exports of the
attempt should the agent have put them there (:func:`runner.execution.agent_run.redactor`).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from runner.contract import VerifiedContract
from runner.core import safefs
from runner.core.errors import HostConfigError, PolicyViolation, ProtocolAmbiguous

__all__ = [
    "HOST_PROMPT_NAME",
    "AgentAdapter",
    "AgentPlan",
    "TemplateItem",
    "plan_for",
    "prompt_bytes",
    "prompt_record",
    "render",
    "secret_values",
]

PLACEHOLDERS = {
    "prompt": "the prompt file in the container (/job/input/<agent.promptPath>, or "
    "/job/input/agent-prompt.md: the host's)",
    "task": "the contract, /job/input/task.json",
    "model": "agent.model",
    "subagentModel": "agent.subagentModel",
    "effort": "agent.effort",
    "reasoningMode": "agent.reasoningMode",
    "autoCompactWindow": "agent.autoCompactWindow",
    "validationRetries": "agent.validationRetries",
    "maxTurns": "agent.maxTurns left after the earlier attempts (the host's cap when the "
    "contract names none)",
    "maxBudgetUsd": "agent.maxBudgetUsd left after the earlier attempts (likewise)",
}
"""What an argv template may name, as ``{name}``."""

_PLACEHOLDER = re.compile(r"\{([A-Za-z]+)\}")
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
_HOST_PORT = r"^[A-Za-z0-9*]([A-Za-z0-9.*-]{0,252}[A-Za-z0-9])?:[0-9]{1,5}$"

# The length is a constraint of its own, not a bounded repetition in the pattern: pydantic-core's
# regex engine unrolls `[^\x00]{0,1023}` over every Unicode character, which took about 15 ms
# of every process that builds the host policy's model (every `runner run` and `runner
# verify`); the pattern with `*` or `+` and `max_length` accept and refuse the same strings.
_RuntimePath = Annotated[str, StringConstraints(pattern=r"^/[^\x00]*$", max_length=1024)]
_Command = Annotated[str, StringConstraints(pattern=r"^[^\x00\s]+$", max_length=1024)]

SECRET_MAX_BYTES = 64 * 1024
"""A secret file is at most this large."""

HOST_PROMPT_NAME = "agent-prompt.md"
HOST_PROMPT = f"/job/input/{HOST_PROMPT_NAME}"
"""Where the host's prompt (a contract without agent.promptPath) is staged."""
PROMPT_MAX_BYTES = 1024 * 1024
"""A host's prompt file is at most this large."""


def _placeholders(text: str) -> list[str]:
    return _PLACEHOLDER.findall(text)


class AgentSecret(BaseModel):
    """A secret the host injects as one environment variable of the agent's container: read
    from a host file (its content, without a trailing newline) or from the runner's own
    environment. Never written anywhere by the runner."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: Annotated[str, StringConstraints(pattern=_ENV_NAME)] = Field(
        description="The variable the agent sees, e.g. ANTHROPIC_API_KEY."
    )
    file: str | None = Field(default=None, description="A host file holding the value.")
    fromEnv: Annotated[str, StringConstraints(pattern=_ENV_NAME)] | None = Field(
        default=None, description="A variable of the runner's own environment holding it."
    )

    @model_validator(mode="after")
    def _one_source(self) -> AgentSecret:
        if (self.file is None) == (self.fromEnv is None):
            raise ValueError(f"secret {self.env}: give exactly one of file and fromEnv")
        if self.file is not None and not os.path.isabs(self.file):
            raise ValueError(f"secret {self.env}: file must be an absolute host path")
        return self


class AgentPrices(BaseModel):
    """USD per million tokens, for the runner's own estimate of an agent's cost from the usage
    its transcript shows (the runtime's own reported cost counts when higher)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inputPerMTok: float = Field(default=0, ge=0)
    outputPerMTok: float = Field(default=0, ge=0)
    cacheReadPerMTok: float = Field(default=0, ge=0)
    cacheWritePerMTok: float = Field(default=0, ge=0)


TemplateItem = str | list[str]


class AgentAdapter(BaseModel):
    """How this host runs one agent runtime."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = Field(
        min_length=1,
        description="The runtime's image: 'name@sha256:<manifest digest>' or 'sha256:<image "
        "id>' (a tag only where the policy allows unpinned images). By default its "
        "runtimePaths are brought into the contract's image, where the agent's commands run; "
        "with runIn adapter-image the agent runs in this image instead.",
    )
    runIn: Literal["contract-image", "adapter-image"] = Field(
        default="contract-image",
        description="Where the agent (and every command it runs) runs: contract-image, the "
        "contract's environment.image with the runtime's files mounted read-only at "
        "/opt/runner-agent; adapter-image, this adapter's image (the contract's image is "
        "then only recorded).",
    )
    runtimePaths: list[_RuntimePath] = Field(
        default_factory=list,
        description="The runtime's files in its image (absolute paths: files or folders), "
        "each mounted at /opt/runner-agent/<base name> in the contract's container; "
        "required with runIn contract-image.",
    )
    runtimeRequires: list[_Command] = Field(
        default_factory=list,
        description="Commands (names looked up on the contract image's PATH, or absolute "
        "paths) the runtime needs in the contract's image besides /bin/sh and its argv's "
        "first word, e.g. bash for Claude Code's Bash tool.",
    )
    prompts: dict[Literal["agent_planned"], str] = Field(
        default_factory=dict,
        description="The host's prompt file (an absolute host path) per execution mode, for "
        "a contract that names no agent.promptPath; none: the runner's default prompt "
        "(runner/prompts/agent_planned.md).",
    )
    imageId: Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")] | None = Field(
        default=None, description="The image id the image must have."
    )
    argv: list[TemplateItem] = Field(
        min_length=1,
        description="The argv that starts the runtime. Strings may name placeholders "
        "({prompt}, {task}, {model}, {effort}, {maxTurns}, {maxBudgetUsd}, ...; "
        "docs/how-to/agent-runs.md). A "
        "string whose placeholder has no value refuses the contract; a list is a group of "
        "elements dropped together when one of its placeholders has no value (an option and "
        'its value: ["--model", "{model}"]).',
    )
    env: dict[Annotated[str, StringConstraints(pattern=_ENV_NAME)], str] = Field(
        default_factory=dict,
        description="Environment of the runtime (not secret; RUNNER_* names are the runner's).",
    )
    secrets: list[AgentSecret] = Field(
        default_factory=list, description="Secrets injected as environment variables only."
    )
    allow: list[Annotated[str, StringConstraints(pattern=_HOST_PORT)]] = Field(
        default_factory=list,
        description="host:port pairs the agent may reach (the model's API), through the "
        "egress allowlist proxy.",
    )
    network: str | None = Field(
        default=None,
        description="An engine network the host operator made for agents (an internal one "
        "with its own model gateway, say) that the agent's container joins; null: none.",
    )
    usage: Literal["claude-code", "none"] = Field(
        default="none",
        description="How the runner reads the agent's usage from its transcript (stdout): "
        "claude-code is Claude Code's --output-format stream-json (the scripted runtime "
        "speaks it too); none: turns and cost are not observed.",
    )
    prices: AgentPrices | None = Field(
        default=None, description="Prices for the runner's own cost estimate from token usage."
    )
    maxTurns: int | None = Field(
        default=None, ge=0, description="The most turns a contract may ask for (and the default)."
    )
    maxBudgetUsd: float | None = Field(
        default=None, ge=0, description="The most USD a contract may ask for (and the default)."
    )

    @model_validator(mode="after")
    def _check(self) -> AgentAdapter:
        for item in self.argv:
            for text in [item] if isinstance(item, str) else item:
                unknown = [n for n in _placeholders(text) if n not in PLACEHOLDERS]
                if unknown:
                    raise ValueError(
                        f"argv element {text!r} names {', '.join(unknown)}; placeholders are "
                        + ", ".join("{" + n + "}" for n in PLACEHOLDERS)
                    )
            if isinstance(item, list) and not item:
                raise ValueError("an argv group must not be empty")
        names = [*self.env, *(s.env for s in self.secrets)]
        runner_owned = [n for n in names if n.startswith("RUNNER_")]
        if runner_owned:
            raise ValueError(f"{', '.join(runner_owned)}: RUNNER_* variables are the runner's")
        if len(set(names)) != len(names):
            raise ValueError("a variable is named twice in env and secrets")
        if self.runIn == "contract-image" and not self.runtimePaths:
            raise ValueError(
                "runIn contract-image brings the runtime into the contract's image: name its "
                'files in runtimePaths (e.g. ["/usr/local/bin/claude", '
                '"/usr/local/bin/run-claude"]), or set "runIn": "adapter-image"'
            )
        bases = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.runtimePaths]
        if any(not b for b in bases) or len(set(bases)) != len(bases):
            raise ValueError("runtimePaths: each path needs a base name of its own")
        for mode, path in self.prompts.items():
            if not os.path.isabs(path):
                raise ValueError(f"prompts.{mode}: an absolute host path")
        if self.network in {"host", "default"} or (
            self.network is not None
            and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", self.network)
        ):
            raise ValueError(f"network {self.network!r}: name a network made for agents")
        return self


@dataclass(frozen=True)
class AgentPlan:
    """An adapter applied to one contract: what each attempt of its agent gets."""

    runtime: str
    adapter: AgentAdapter
    contract_image: str
    """The contract's environment.image, as written (the job's image, unless the adapter
    runs the agent in its own: runIn adapter-image)."""
    prompt: str
    """The prompt file in the container."""
    values: Mapping[str, str]
    """Placeholder values other than the limits."""
    max_turns: int | None
    max_budget_usd: float | None
    prompt_source: Literal["contract", "host", "default"] = "contract"
    """Where the prompt comes from: the contract's agent.promptPath (an input like the
    others), the host adapter's prompts (a host file), or the runner's default prompt; the
    latter two are staged by the runner as /job/input/agent-prompt.md."""
    prompt_file: str | None = None
    """The host's prompt file (prompt_source host)."""

    @property
    def in_contract_image(self) -> bool:
        """Whether the agent runs in the contract's image (its runtime brought in)."""
        return self.adapter.runIn == "contract-image"

    def argv(self, turns_left: int | None, budget_left: float | None) -> tuple[str, ...]:
        """The argv of an attempt with these limits left."""
        values = dict(self.values)
        if turns_left is not None:
            values["maxTurns"] = str(turns_left)
        if budget_left is not None:
            values["maxBudgetUsd"] = _usd(budget_left)
        return render(self.adapter.argv, values)

    def left(self, turns: int, cost: float) -> tuple[int | None, float | None]:
        """What is left of the limits after ``turns`` and ``cost`` of earlier attempts."""
        turns_left = None if self.max_turns is None else self.max_turns - turns
        budget_left = None if self.max_budget_usd is None else self.max_budget_usd - cost
        return turns_left, budget_left


def _usd(value: float) -> str:
    return f"{max(value, 0.0):.6f}".rstrip("0").rstrip(".") or "0"


def render(template: Sequence[TemplateItem], values: Mapping[str, str]) -> tuple[str, ...]:
    """The argv: each placeholder replaced by its value (once: a value is never expanded
    again); a group with a placeholder that has no value is dropped. Raises KeyError naming
    the placeholder of a plain element that has none."""

    def fill(text: str) -> str:
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)

    out: list[str] = []
    for item in template:
        if isinstance(item, str):
            out.append(fill(item))
        elif all(n in values for text in item for n in _placeholders(text)):
            out.extend(fill(text) for text in item)
    return tuple(out)


def plan_for(contract: VerifiedContract, agents: Mapping[str, AgentAdapter]) -> AgentPlan:
    """The agent plan of an agent_planned contract; refuses an unknown runtime, a missing
    prompt, limits above the host's caps and a template the contract cannot fill."""
    agent = contract.model.agent
    runtime = agent.runtime if agent else None
    offered = ", ".join(sorted(agents)) or "none"
    if agent is None or not runtime:
        raise ProtocolAmbiguous(
            "$.agent.runtime: this contract is agent_planned and names no agent runtime",
            hint=f'name one in "agent": {{"runtime": ...}} (this host offers: {offered})',
        )
    adapter = agents.get(runtime)
    if adapter is None:
        raise PolicyViolation(
            f"$.agent.runtime: the contract asks for the agent runtime {runtime!r}; this host "
            f"offers {offered}",
            hint="issue the contract for a runtime this host offers, or add an adapter for it "
            "to the host policy's 'agents'",
        )
    source: Literal["contract", "host", "default"] = "contract"
    prompt_file = None
    if agent.promptPath:
        prompt = "/job/input/" + os.path.normpath(agent.promptPath)
    else:  # the platform's contracts: the prompt is the host's, for the execution mode
        prompt_file = adapter.prompts.get("agent_planned")
        source = "default" if prompt_file is None else "host"
        prompt = HOST_PROMPT
    turns = _capped("maxTurns", agent.maxTurns, adapter.maxTurns, runtime)
    max_turns = None if turns is None else int(turns)
    max_budget = _capped("maxBudgetUsd", agent.maxBudgetUsd, adapter.maxBudgetUsd, runtime)
    values = {"prompt": prompt, "task": "/job/input/task.json"}
    for name in ("model", "subagentModel", "effort", "reasoningMode"):
        value = getattr(agent, name)
        if value:
            values[name] = str(value)
    for name in ("autoCompactWindow", "validationRetries"):
        if getattr(agent, name) is not None:
            values[name] = str(getattr(agent, name))
    plan = AgentPlan(
        runtime,
        adapter,
        contract.model.environment.image,
        prompt,
        values,
        max_turns,
        max_budget,
        source,
        prompt_file,
    )
    try:
        plan.argv(max_turns, max_budget)
    except KeyError as exc:
        name = exc.args[0]
        raise ProtocolAmbiguous(
            f"$.agent.{name}: this host's {runtime!r} runtime is started with it and the "
            "contract leaves it empty",
            hint=f"give agent.{name} a value",
        ) from None
    return plan


def prompt_bytes(plan: AgentPlan) -> bytes | None:
    """The host's prompt an attempt stages as /job/input/agent-prompt.md: the adapter's file
    for the mode, else the runner's default; None when the contract names its own."""
    if plan.prompt_source == "contract":
        return None
    if plan.prompt_file is None:
        return (Path(__file__).parent / "agent-prompt.md").read_bytes()
    try:
        return safefs.read_named(Path(plan.prompt_file), PROMPT_MAX_BYTES)
    except (OSError, safefs.UnsafePath) as exc:
        why = exc.problem if isinstance(exc, safefs.UnsafePath) else exc.strerror
        raise HostConfigError(
            f"the {plan.runtime} adapter's prompt {plan.prompt_file} cannot be read: {why}",
            hint="fix the file the host policy's agents.<runtime>.prompts names (a regular "
            f"file of at most {PROMPT_MAX_BYTES:,} bytes)",
        ) from None


def prompt_record(plan: AgentPlan, prompt: bytes) -> dict[str, str]:
    """The staged host prompt, as the ledger's attempt.starting records it."""
    return {
        "path": HOST_PROMPT_NAME,
        "sha256": "sha256:" + hashlib.sha256(prompt).hexdigest(),
        "source": plan.prompt_source,
        **({"hostFile": plan.prompt_file} if plan.prompt_file else {}),
    }


def _capped(name: str, asked: float | None, cap: float | None, runtime: str) -> float | None:
    if asked is None:
        return cap
    if cap is not None and asked > cap:
        raise PolicyViolation(
            f"$.agent.{name}: the contract asks for {asked:g}; this host's {runtime!r} runtime "
            f"allows at most {cap:g}",
            hint=f"issue the contract with {name} <= {cap:g}",
        )
    return asked


def secret_values(
    adapter: AgentAdapter, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The adapter's secrets, read now: ``{variable: value}``. A secret that cannot be read
    is the host's configuration failing (never the job's); the message names where it was
    looked for, never a value."""
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for secret in adapter.secrets:
        if secret.file is not None:
            try:
                raw = safefs.read_named(Path(secret.file), SECRET_MAX_BYTES)
            except (OSError, safefs.UnsafePath) as exc:
                why = exc.problem if isinstance(exc, safefs.UnsafePath) else exc.strerror
                raise HostConfigError(
                    f"the agent secret {secret.env} cannot be read from {secret.file}: {why}",
                    hint="fix the file the host policy's agents.<runtime>.secrets names",
                ) from None
            try:
                value = raw.decode().rstrip("\r\n")
            except UnicodeDecodeError:
                value = ""
        else:
            value = environ.get(secret.fromEnv or "", "")
        if not value or "\x00" in value:
            where = secret.file or f"the runner's environment variable {secret.fromEnv}"
            raise HostConfigError(
                f"the agent secret {secret.env} is empty (or not text) in {where}",
                hint="put the value there, or remove the secret from the host policy",
            )
        out[secret.env] = value
    return out
