"""Fixtures. Tests marked ``docker`` use the real engine and the runner-cpu:local image that
``scripts/setup.sh`` builds; when either is missing they fail (never skip). Helpers live in
``tests/support``."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.support import IMAGE, SESSION_ID, SESSION_LABEL, docker
from tests.support.hostenv import HOST_VARIABLES


@pytest.fixture(scope="session", autouse=True)
def _isolated_host_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Tests never read the developer's own policy or trusted keys: an empty config dir, and
    none of the runner's host variables from the environment. Only the runner's own are
    cleared: a CI service's ``RUNNER_TEMP`` or ``RUNNER_OS`` stays."""
    saved = dict(os.environ)
    for name in HOST_VARIABLES:
        os.environ.pop(name, None)
    os.environ["RUNNER_CONFIG_DIR"] = str(tmp_path_factory.mktemp("runner-config"))
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def image_id() -> str:
    """Id of the locally built job image; fails (not skips) when the engine or image is absent."""
    info = docker("info", "--format", "{{.ServerVersion}}")
    if info.returncode != 0:
        pytest.fail(
            f"the Docker engine is not reachable: {info.stderr.strip()} "
            "(scripts/setup.sh starts it)"
        )
    out = docker("image", "inspect", "--format", "{{.Id}}", IMAGE)
    if out.returncode != 0:
        pytest.fail(f"{IMAGE} is missing: run scripts/setup.sh ({out.stderr.strip()})")
    return out.stdout.strip()


def _local_image(tag: str) -> str:
    out = docker("image", "inspect", "--format", "{{.Id}}", tag)
    if out.returncode != 0:
        pytest.fail(f"{tag} is missing: run scripts/setup.sh ({out.stderr.strip()})")
    return out.stdout.strip()


@pytest.fixture(scope="session")
def scripted_agent_image(image_id: str) -> str:
    """Id of the scripted agent runtime's image (runner-agent-scripted:local)."""
    return _local_image("runner-agent-scripted:local")


@pytest.fixture(scope="session")
def claude_agent_image(image_id: str) -> str:
    """Id of the Claude Code agent image (runner-agent-claude:local), with this checkout's
    run-claude wrapper (tests.support.agents.claude_image_with_this_wrapper)."""
    from tests.support.agents import claude_image_with_this_wrapper

    return claude_image_with_this_wrapper(_local_image("runner-agent-claude:local"))


@pytest.fixture(autouse=True)
def _free_egress_slots(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each engine test, the session's free egress slots go (as `runner cleanup`
    removes them): each test's state folder has its own pool, and every slot holds one of
    the engine's few address pools."""
    yield
    if request.node.get_closest_marker("docker") is not None:
        from runner import backends
        from runner.egress import slots as egress

        egress.reap(backends.default(), idle_seconds=0.0, labels={SESSION_LABEL: SESSION_ID})


@pytest.fixture(scope="session", autouse=True)
def _no_containers_left() -> Iterator[None]:
    """After the session, no container of this test session may remain."""
    yield
    if shutil.which("docker") is None:
        return
    from runner import backends
    from runner.egress import slots as egress

    # The egress slots the session's jobs leased outlive them by design (runner.egress.slots); free
    # ones go as `runner cleanup` removes them. One still busy stays, and fails the check.
    egress.reap(backends.default(), idle_seconds=0.0, labels={SESSION_LABEL: SESSION_ID})
    left = docker("ps", "-aq", "--filter", f"label={SESSION_LABEL}={SESSION_ID}").stdout.split()
    if left:
        docker("rm", "-f", *left)
        pytest.fail(f"containers left behind by the runner: {left}")
