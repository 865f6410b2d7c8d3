"""Helpers for the agent-planned runs: the scripted model server as a container on an
internal network of the test's own, the claude image with this checkout's wrapper, and a
search for a secret in every file a run leaves. The example's contract, the one-adapter host
policy and the agent images' argv live in :mod:`runner.testing.agents` (the benchmark uses
them too) and are re-exported here."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner import backends
from runner.egress import slots as egress
from runner.testing import IMAGE, docker, image_id_of
from runner.testing.agents import (
    CLAUDE_ARGV,
    CLAUDE_RUNTIME,
    EXAMPLE,
    SCRIPTED_ARGV,
    SCRIPTED_RUNTIME,
    agent_contract,
    agent_policy,
)
from runner.testing.egress import SUBNET
from tests.support.jobs import ROOT, SESSION_ID, SESSION_LABEL

__all__ = [
    "CLAUDE_ARGV",
    "CLAUDE_RUNTIME",
    "EXAMPLE",
    "MODEL_SERVER",
    "SCRIPTED_ARGV",
    "SCRIPTED_RUNTIME",
    "ModelServer",
    "agent_contract",
    "agent_policy",
    "claude_image_with_this_wrapper",
    "files_holding",
    "image_id_of",
    "members_holding",
    "model_server",
    "transcript_events",
]

MODEL_SERVER = ROOT / "tests" / "support" / "model_server.py"


def claude_image_with_this_wrapper(image: str) -> str:
    """``image`` (runner-agent-claude) with this checkout's images/agent-claude/run-claude:
    the image itself when its wrapper is the checkout's, else an image made from it with
    only the wrapper replaced (offline, a tag of the test's own), so that the tests run the
    wrapper this checkout ships even where setup.sh built the image before it changed."""
    wrapper = ROOT / "images" / "agent-claude" / "run-claude"
    have = docker("run", "--rm", "--network", "none", "--entrypoint", "cat", image,
                  "/usr/local/bin/run-claude")  # fmt: skip
    assert have.returncode == 0, have.stderr
    if have.stdout == wrapper.read_text():
        return image
    tag = (
        "runner-test-agent-claude:"
        + hashlib.sha256((image + wrapper.read_text()).encode()).hexdigest()[:16]
    )
    with tempfile.TemporaryDirectory() as context:
        shutil.copy(wrapper, Path(context) / "run-claude")
        (Path(context) / "Dockerfile").write_text(
            f"FROM {image}\nCOPY run-claude /usr/local/bin/run-claude\n"
        )
        built = docker("build", "--network", "none", "-q", "-t", tag, context)
        assert built.returncode == 0, built.stderr
    return image_id_of(tag)


def files_holding(root: Path, needle: bytes) -> list[str]:
    """Every regular file under ``root`` whose bytes hold ``needle`` (links are not followed)."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
            found.append(str(path.relative_to(root)))
    return found


def members_holding(archive: Path, needle: bytes) -> list[str]:
    """Every file in a tar archive (compressed or not) whose bytes hold ``needle``."""
    found = []
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if member.isfile():
                f = tar.extractfile(member)
                if f is not None and needle in f.read():
                    found.append(member.name)
    return found


def transcript_events(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in io.StringIO(path.read_text()):
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return events


@dataclass(frozen=True)
class ModelServer:
    """The scripted Messages API server, a container on the internal network ``network``
    under the name ``host``; every request it answered is a line of ``log``."""

    network: str
    host: str
    port: int
    log: Path
    subnet: str

    def egress(self, **more: str) -> dict[str, object]:
        """A host policy's egress through ``network``, whose (private) addresses the proxy
        may connect to."""
        return {"upstreamNetwork": self.network, "privateNetworks": [self.subnet], **more}

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]


@contextlib.contextmanager
def model_server(folder: Path, scenario: str) -> Iterator[ModelServer]:
    """Start the scripted model (``scenario``) on an internal network made for the test (no
    route out: the job can reach nothing else there), and remove both afterwards."""
    suffix = uuid.uuid4().hex[:10]
    network = f"runner-test-agents-{suffix}"
    name = f"runner-test-model-{suffix}"
    logs = folder / f"model-log-{suffix}"
    logs.mkdir(mode=0o777)
    logs.chmod(0o777)  # the server runs as the image's user
    made = docker("network", "create", "--internal", "--label", f"{SESSION_LABEL}={SESSION_ID}",
                  network)  # fmt: skip
    assert made.returncode == 0, made.stderr
    try:
        started = docker(
            "run", "-d", "--name", name, "--network", network, "--network-alias", "model.test",
            "--label", f"{SESSION_LABEL}={SESSION_ID}", "--read-only",
            "-v", f"{MODEL_SERVER}:/srv/model_server.py:ro", "-v", f"{logs}:/log",
            IMAGE, "python3", "/srv/model_server.py", "--port", "8080", "--scenario", scenario,
            "--log", "/log/requests.jsonl",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        deadline = time.monotonic() + 30
        while "serving" not in docker("logs", name).stderr:
            assert time.monotonic() < deadline, docker("logs", name).stderr
            time.sleep(0.1)
        subnet = docker("network", "inspect", "--format", SUBNET, network).stdout.strip()
        yield ModelServer(network, "model.test", 8080, logs / "requests.jsonl", subnet)
    finally:
        docker("rm", "-f", name)
        # The session's free egress slots first: their proxies are on this network.
        egress.reap(backends.default(), idle_seconds=0.0, labels={SESSION_LABEL: SESSION_ID})
        gone = docker("network", "rm", network)
        assert gone.returncode == 0, gone.stderr
