"""Agent-planned runs for tests and benchmarks: the agent example's contract (from a source
checkout's ``examples/agent-evaluation``) with a prompt of the caller's own, a host policy
offering one adapter, and the argv and runtime files of the two agent images scripts/setup.sh
builds (runner-agent-scripted, runner-agent-claude)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.contract import with_digest
from runner.testing.contracts import EXAMPLES, IMAGE
from runner.testing.engine import image_id_of

__all__ = [
    "CLAUDE_ARGV",
    "CLAUDE_RUNTIME",
    "EXAMPLE",
    "SCRIPTED_ARGV",
    "SCRIPTED_RUNTIME",
    "agent_contract",
    "agent_policy",
]

EXAMPLE = EXAMPLES / "agent-evaluation"

SCRIPTED_ARGV: list[Any] = [
    "python3",
    "/opt/runner-agent/agent.py",
    "--prompt",
    "{prompt}",
    ["--max-turns", "{maxTurns}"],
    ["--max-budget-usd", "{maxBudgetUsd}"],
    ["--model", "{model}"],
]

SCRIPTED_RUNTIME: dict[str, Any] = {"runtimePaths": ["/opt/runner-agent/agent.py"]}
"""The scripted runtime's files in its image (brought into the contract's, which needs
python3: the argv's first word)."""

CLAUDE_RUNTIME: dict[str, Any] = {
    "runtimePaths": ["/usr/local/bin/claude", "/usr/local/bin/run-claude"],
    "runtimeRequires": ["bash"],
}
"""Claude Code's files in runner-agent-claude (the native binary and its wrapper); its Bash
tool needs bash in the contract's image."""

CLAUDE_ARGV: list[Any] = [
    "/opt/runner-agent/run-claude",
    "{prompt}",
    "--output-format",
    "stream-json",
    "--verbose",
    ["--max-turns", "{maxTurns}"],
    ["--max-budget-usd", "{maxBudgetUsd}"],
    ["--model", "{model}"],
    ["--effort", "{effort}"],
    "--allowedTools",
    "Bash,Read,Write",
    "--no-session-persistence",
]


def agent_contract(
    folder: Path,
    *,
    runtime: str = "scripted",
    prompt: str | None = None,
    agent: dict[str, Any] | None = None,
    change: Callable[[dict[str, Any]], None] | None = None,
    image: str | None = None,
) -> Path:
    """The example's agent_planned contract in ``folder`` with its inputs, for ``runtime``,
    its prompt ``prompt`` (default: the example's scripted prompt) and ``agent`` fields; its
    environment.image ``image`` (default: runner-cpu:local's image id, a pin)."""
    data = json.loads((EXAMPLE / "task.scripted.json").read_text())
    data["environment"]["image"] = image or image_id_of(IMAGE)
    shutil.copytree(EXAMPLE / "repository", folder / "repository", dirs_exist_ok=True)
    shutil.copy(EXAMPLE / "paper.md", folder / "paper.md")
    text = prompt if prompt is not None else (EXAMPLE / "prompt.scripted.md").read_text()
    (folder / "prompt.md").write_text(text)
    data["agent"] = {"runtime": runtime, "promptPath": "prompt.md", **(agent or {})}
    if change is not None:
        change(data)
    data.pop("contractDigest", None)
    path = folder / "task.json"
    path.write_text(json.dumps(with_digest(data), indent=2))
    return path


def agent_policy(
    folder: Path, runtime: str, image: str, *, egress: dict[str, Any] | None = None, **adapter: Any
) -> Path:
    """A host policy offering one agent runtime, pinned to the image id ``image`` (and, with
    ``egress``, the policy's egress grant: the allowlist proxy's upstream network)."""
    path = folder / "policy.json"
    policy: dict[str, Any] = {"agents": {runtime: {"image": image, **adapter}}}
    if egress is not None:
        policy["egress"] = egress
    path.write_text(json.dumps(policy, indent=2))
    return path
