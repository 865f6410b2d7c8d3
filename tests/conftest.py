"""Fixtures. Tests marked ``docker`` use the real engine and the runner-cpu:local image that
``scripts/setup.sh`` builds, ``slurm`` the single-node Slurm, ``podman`` rootful Podman. When one
is missing, its tests are skipped locally, with one line saying why, and fail the run under CI
(``CI`` set, as CI services set it): a CI run never passes by skipping. Helpers live in
``tests/support``."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import NoReturn

import pytest

from runner.core import clock
from tests.support import IMAGE, SESSION_ID, SESSION_LABEL, docker
from tests.support.clock import VirtualClock
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


def _under_ci() -> bool:
    """A CI run (``CI`` set and not ``0``/``false``): a missing component fails it."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(reason: str) -> NoReturn:
    """A real component the test needs is absent: fail under CI, skip locally."""
    if _under_ci():
        pytest.fail(reason)
    pytest.skip(reason)


def _engine_problem() -> str | None:
    """Why the engine tests cannot run here (engine unreachable, job image absent), or None."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed: run scripts/setup.sh"
    info = docker("info", "--format", "{{.ServerVersion}}")
    if info.returncode != 0:
        first = (info.stderr.strip().splitlines() or ["no answer"])[0]
        return f"the Docker engine is not reachable: {first} (scripts/setup.sh starts it)"
    out = docker("image", "inspect", "--format", "{{.Id}}", IMAGE)
    if out.returncode != 0:
        return f"{IMAGE} is missing: run scripts/setup.sh"
    return None


def _slurm_problem() -> str | None:
    """Why the Slurm tests cannot run here, or None (the same test as test_slurm's cluster)."""
    if shutil.which("sinfo") is None:
        return "Slurm is not installed: run scripts/setup.sh (scripts/setup_slurm.sh)"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                             check=False, timeout=30)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "Slurm does not answer within 30 s (scripts/setup_slurm.sh starts it)"
    if out.returncode != 0 or not {"idle", "mixed", "allocated"} & set(out.stdout.split()):
        return "Slurm does not answer or has no usable node (scripts/setup_slurm.sh starts it)"
    return None


def _podman_problem() -> str | None:
    """Why the Podman tests cannot run here (no podman, or its rootful API does not answer)."""
    if shutil.which("podman") is None:
        return "podman is not installed: run scripts/setup.sh (scripts/setup_podman.sh)"
    from runner.backends.podman import ROOTFUL_SOCKET, PodmanBackend

    try:
        PodmanBackend(f"unix://{ROOTFUL_SOCKET}").ping()
    except Exception as exc:  # noqa: BLE001 - any failure to answer is the reason to give
        return f"rootful Podman does not answer ({exc}): scripts/setup_podman.sh starts it"
    return None


_PROBES = {"docker": _engine_problem, "slurm": _slurm_problem, "podman": _podman_problem}
_MISSING = pytest.StashKey[str]()
"""Why a collected test is skipped: the component it is marked for is missing here."""
_ENGINE_TESTS = pytest.StashKey[bool]()
"""Whether the session collected a test marked ``docker``."""
LONGEST_FILES = ("test_slurm_two_nodes.py",)
"""Measured among the longest files (about 2 min on one worker: a lost node requeued):
first of the slow ones."""

_ENGINE_MISSING = pytest.StashKey[bool]()
"""Whether its ``docker`` tests are skipped: the engine or its job image is missing (not CI)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Locally (CI unset), the tests of a missing component are skipped, and one line per
    component says why. Under CI nothing is skipped: their fixtures fail, as they always did.
    Each component is probed once, and only when a collected test needs it.

    The files that hold a ``slow`` test come first (each file's tests stay together and in
    order): under ``--dist loadfile`` a worker takes a file at a time in this order, so the
    longest (the lost Slurm node's two leases, the GiB parsers) start at once instead of last,
    which had left three workers idle while one ran them."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(  # stable: files stay whole
        key=lambda item: (item.path.name not in LONGEST_FILES, item.path not in slow_files)
    )
    config.stash[_ENGINE_TESTS] = any(item.get_closest_marker("docker") for item in items)
    if _under_ci():
        return
    problems: dict[str, str | None] = {}
    skipped: dict[str, int] = {}
    for item in items:
        for marker in ("docker", "slurm", "podman"):
            if item.get_closest_marker(marker) is None:
                continue
            if marker not in problems:
                problems[marker] = _PROBES[marker]()
            reason = problems[marker]
            if reason is not None:
                item.stash[_MISSING] = f"{marker}: {reason}"
                skipped[marker] = skipped.get(marker, 0) + 1
                break
    config.stash[_ENGINE_MISSING] = problems.get("docker") is not None
    lines = [
        f"SKIPPING {count} {marker} tests: {problems[marker]} (under CI=true they fail)"
        for marker, count in skipped.items()
    ]
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its controller prints them (see below)
        workeroutput["runner_skipping"] = lines
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for line in lines:
        if reporter is not None:
            reporter.write_line(line, yellow=True)


_SKIPPING = pytest.StashKey[list[str]]()
"""Under pytest-xdist, the lines the workers' collection gave (each worker collects all)."""


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """A worker of ``pytest -n`` ended: keep the lines its collection gave, once."""
    config: pytest.Config = node.config  # type: ignore[attr-defined]
    lines = (getattr(node, "workeroutput", None) or {}).get("runner_skipping")
    if lines and _SKIPPING not in config.stash:
        config.stash[_SKIPPING] = list(lines)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Under ``pytest -n`` the workers collect, so the skip lines come at the end."""
    for line in terminalreporter.config.stash.get(_SKIPPING, []):
        terminalreporter.write_line(line, yellow=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a test whose component is missing (see above). Skipped from here, not by a marker
    on each test, so that pytest's summary folds them into one line per reason."""
    reason = item.stash.get(_MISSING, None)
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def virtual_clock() -> Iterator[VirtualClock]:
    """The runner reads time from a clock this test controls (:mod:`tests.support.clock`):
    its sleeps take no time, and are recorded."""
    with clock.use(VirtualClock()) as virtual:
        assert isinstance(virtual, VirtualClock)
        yield virtual


@pytest.fixture(scope="session")
def image_id() -> str:
    """Id of the locally built job image; when the engine or image is absent it fails under
    CI and skips locally (:func:`missing`)."""
    info = docker("info", "--format", "{{.ServerVersion}}")
    if info.returncode != 0:
        missing(
            f"the Docker engine is not reachable: {info.stderr.strip()} "
            "(scripts/setup.sh starts it)"
        )
    out = docker("image", "inspect", "--format", "{{.Id}}", IMAGE)
    if out.returncode != 0:
        missing(f"{IMAGE} is missing: run scripts/setup.sh ({out.stderr.strip()})")
    return out.stdout.strip()


def _local_image(tag: str) -> str:
    out = docker("image", "inspect", "--format", "{{.Id}}", tag)
    if out.returncode != 0:
        missing(f"{tag} is missing: run scripts/setup.sh ({out.stderr.strip()})")
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
def _no_containers_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """After the session, no container of this test session may remain. A session with no
    engine test (tests/unit alone), or whose engine tests were skipped for want of an engine,
    has none to look for, and asks no engine."""
    yield
    if shutil.which("docker") is None:
        return
    if not request.config.stash.get(_ENGINE_TESTS, True):
        return
    if request.config.stash.get(_ENGINE_MISSING, False):
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
