"""The fourth hostile review's engine case (its pure cases are in
tests/unit/test_hostile_review_round4.py): the engine's archive HEAD for a path through a
file, which the fake backend copies."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.backends.docker import DockerBackend
from runner.core.errors import PolicyViolation
from runner.execution import agentfit, agentimage
from tests.support.agents import SCRIPTED_RUNTIME

pytestmark = pytest.mark.hostile


@pytest.mark.docker
def test_the_engine_answers_so_for_a_path_through_a_file(
    tmp_path: Path, image_id: str, scripted_agent_image: str
) -> None:
    """What the fake copies: the engine's archive HEAD for /etc/passwd/python3 is a 500."""
    backend = DockerBackend()
    info = backend.inspect_image(image_id)
    assert info is not None
    runtime = agentimage.ensure(backend, scripted_agent_image, SCRIPTED_RUNTIME["runtimePaths"],
                                tmp_path / "cache", {})  # fmt: skip
    argv = ["python3", "/opt/runner-agent/agent.py"]
    agentfit.check_fits(backend, info, "runner-cpu", runtime, argv, [], {},
                          "/etc/passwd:/usr/bin")  # fmt: skip
    with pytest.raises(PolicyViolation, match=r"no python3 \(on its PATH /etc/passwd\)"):
        agentfit.check_fits(backend, info, "runner-cpu", runtime, argv, [], {}, "/etc/passwd")
