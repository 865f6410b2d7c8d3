"""Helpers for code that embeds the runner, and for the runner's own tests and benchmarks.

- :class:`FakeBackend` and :class:`FakeJob`: the in-memory backend (``runner.backends.fake``),
  scripted per container, for tests of code above the backend seam; no engine, no container.
- :func:`write_contract` and its parts: contracts written from the toy example, and
  :func:`json_measurement` (a json.scalar measurement).
- :func:`agent_contract`, :func:`agent_policy` and the agent images' argv and runtime files.
- :func:`outside`: the egress allowlist's test topology (test hosts on an internal network
  of the caller's own; nothing leaves the machine).
- :func:`docker` and :func:`image_id_of`: the docker CLI, as these helpers call it.

The contract and agent helpers read the examples of a source checkout (``examples/`` is not
in the wheel); the egress and agent helpers need the Docker engine and the images
scripts/setup.sh builds. Nothing in the runner imports this package (an import-linter
contract in pyproject.toml), so none of it is on the path of a real run.
"""

from runner.backends.fake import FakeBackend, FakeJob
from runner.testing.agents import (
    CLAUDE_ARGV,
    CLAUDE_RUNTIME,
    SCRIPTED_ARGV,
    SCRIPTED_RUNTIME,
    agent_contract,
    agent_policy,
)
from runner.testing.contracts import (
    IMAGE,
    TOY,
    copy_toy_inputs,
    json_measurement,
    toy_data,
    write_contract,
)
from runner.testing.egress import Outside, left_behind, outside
from runner.testing.engine import docker, image_id_of

__all__ = [
    "CLAUDE_ARGV",
    "CLAUDE_RUNTIME",
    "IMAGE",
    "SCRIPTED_ARGV",
    "SCRIPTED_RUNTIME",
    "TOY",
    "FakeBackend",
    "FakeJob",
    "Outside",
    "agent_contract",
    "agent_policy",
    "copy_toy_inputs",
    "docker",
    "image_id_of",
    "json_measurement",
    "left_behind",
    "outside",
    "toy_data",
    "write_contract",
]
