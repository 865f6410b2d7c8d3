"""The agent runtime in the contract's image, attacked (issue 26's review): the cached runtime
changed or swapped under the runner, an entry pruned while mounted, a copying container left
by a killed runner, a host network lost to the proxy, a fit checked on the wrong PATH or
misread, and an image that does the work in the runtime's place.

Pure tests use the fake backend (an image's files are a host folder); the others the engine.

The tests that need no engine are in tests/unit/test_hostile_agent_image.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.backends.docker import DockerBackend
from runner.execution import sweeper
from runner.state.ledger import Ledger
from tests.integration.test_agent_image import (
    _build,
    _scripted_policy,
)
from tests.support import SESSION_ID, SESSION_LABEL, run_job, session_containers
from tests.support.agents import agent_contract

pytestmark = pytest.mark.hostile


# --------------------------------------------------------------------------- the engine


@pytest.mark.docker
def test_a_copying_container_a_killed_runner_left_is_swept(tmp_path: Path, image_id: str) -> None:
    """The never-started container the runner copies an image's files through carries the
    runner's label and its job's folder: one left by a runner killed mid-copy is found and
    removed by `runner cleanup --state-dir` (before, it carried neither and stayed)."""
    state = tmp_path / "state"
    job = state / "jobs" / "j"
    (job / "record").mkdir(parents=True)
    led = Ledger.open(job / "record" / "ledger.jsonl")
    led.append("job.accepted", "job.accepted", {"contractDigest": "sha256:x", "limitSeconds": 60})
    labels = {SESSION_LABEL: SESSION_ID, "org.runner.job-dir": str(job.resolve())}
    backend = DockerBackend()
    with backend.image_files(image_id, labels) as files:
        assert files.stat("/bin/sh") is not None
        left = backend.find({"org.runner.managed": "true", **labels})
        assert len(left) == 1 and left[0].name.startswith("runner-image-files-")
        report = sweeper.sweep(backend, state_dir=state)
        assert [x["name"] for x in report["removed"]] == [left[0].name]
        assert not backend.find({"org.runner.managed": "true", **labels})


@pytest.mark.docker
def test_an_image_that_does_the_work_in_the_runtimes_place_is_missing_evidence(
    tmp_path: Path, image_id: str, scripted_agent_image: str
) -> None:
    """The contract's image owns /bin/sh: here it writes a result and exits 0 without
    starting the runtime. No model answer in the runner's capture: the attempt ends
    missing_evidence, naming the image (before, it succeeded)."""
    fake_sh = (
        "#!/usr/bin/dash\n"
        "mkdir -p /job/output\n"
        'echo \'{"status": "succeeded"}\' > /job/output/result.json\n'
        "exit 0\n"
    )
    dockerfile = (
        f"FROM {image_id}\nUSER root\nCOPY fakesh /usr/local/bin/fakesh\n"
        'RUN ["/bin/chmod", "755", "/usr/local/bin/fakesh"]\n'
        'RUN ["/bin/ln", "-sf", "/usr/local/bin/fakesh", "/usr/bin/sh"]\n'
    )
    impostor = _build("runner-test-impostor-sh", dockerfile, {"fakesh": fake_sh})
    contract = agent_contract(tmp_path, image=impostor)
    code, env, err = run_job(
        contract, tmp_path / "state", *_scripted_policy(tmp_path, scripted_agent_image)
    )
    assert code != 0, err
    assert env["failure"]["category"] == "missing_evidence", env["failure"]
    assert "without one model answer" in env["failure"]["reason"]
    assert impostor in env["failure"]["reason"] or "sha256:" in env["failure"]["reason"]
    assert not session_containers()
