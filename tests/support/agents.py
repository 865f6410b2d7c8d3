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
import subprocess
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
from tests.support.jobs import ROOT, SESSION_ID, SESSION_LABEL, run_cli

__all__ = [
    "CLAUDE_ARGV",
    "CLAUDE_RUNTIME",
    "EXAMPLE",
    "MODEL_SERVER",
    "SCRIPTED_ARGV",
    "SCRIPTED_RUNTIME",
    "LeakingRun",
    "ModelServer",
    "agent_contract",
    "agent_policy",
    "checkout_proxy_image",
    "claude_image_with_this_wrapper",
    "files_holding",
    "image_id_of",
    "members_holding",
    "model_server",
    "run_leaking_agent",
    "run_with_key",
    "transcript_events",
]

MODEL_SERVER = ROOT / "tests" / "support" / "model_server.py"


def checkout_proxy_image() -> str:
    """The proxy image with this checkout's egress-proxy: runner-proxy:local (as
    scripts/setup.sh built it) with the script copied over it, tagged by the script's digest
    (built once, offline)."""
    script = ROOT / "images" / "proxy" / "egress-proxy"
    tag = "runner-proxy:test-" + hashlib.sha256(script.read_bytes()).hexdigest()[:12]
    if docker("image", "inspect", tag).returncode != 0:
        with tempfile.TemporaryDirectory() as folder:
            shutil.copy(script, Path(folder) / "egress-proxy")
            (Path(folder) / "Dockerfile").write_text(
                "FROM runner-proxy:local\nCOPY egress-proxy /usr/local/bin/egress-proxy\n"
            )
            built = docker("build", "--network", "none", "-q", "-t", tag, folder)
            assert built.returncode == 0, built.stderr
    return tag


def run_with_key(
    contract: Path, policy: Path, state: Path, key: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]:
    """``runner run CONTRACT --json`` under ``policy`` (whose secret reads AGENT_TEST_KEY)
    with the agent's key ``key``, labelled for this session: the process, its envelope and
    the job folder."""
    proc = run_cli(
        "run", str(contract), "--state-dir", str(state), "--json", "--allow-unsigned",
        "--label", f"{SESSION_LABEL}={SESSION_ID}", "--policy", str(policy),
        env={"AGENT_TEST_KEY": key},
    )  # fmt: skip
    env: dict[str, Any] = json.loads(proc.stdout)
    return proc, env, Path(env["jobDir"])


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


@dataclass(frozen=True)
class LeakingRun:
    """What :func:`run_leaking_agent` leaves to look through."""

    proc: subprocess.CompletedProcess[str]
    env: dict[str, Any]
    job: Path
    state: Path
    policy: Path
    proxy_log: str
    """The slot's proxy's engine log (``docker logs``), stdout and stderr."""
    asked: list[dict[str, Any]]
    """The requests the model server got."""


def run_leaking_agent(tmp_path: Path, image: str, leak: str, key: str) -> LeakingRun:
    """An agent run in ``image`` (the scripted agent) whose job runs the toy evaluation, then
    ``leak`` (a script, given the allowed ``host:port``) with the agent's key ``key`` in
    API_KEY, behind the egress proxy of this checkout that allows the model server."""
    (tmp_path / "repository").mkdir()
    (tmp_path / "repository" / "leak.py").write_text(leak)
    with model_server(tmp_path, "evaluate") as server:
        allowed = f"{server.host}:{server.port}"
        prompt = (
            "preflight runtime: python3 -c 'import json'\n"
            "run: mkdir -p /job/output/logs\n"
            "run: python3 repository/evaluate.py --checkpoint repository/checkpoint.json > "
            "/job/output/logs/evaluation.log\n"
            f"run: python3 repository/leak.py {allowed}\n"
        )
        contract = agent_contract(
            tmp_path, prompt=prompt, agent={"maxTurns": 20},
            change=lambda d: d["protocol"]["preflight"].update(
                checks=[{"id": "runtime", "successCriteria": "python3 runs"}]),
        )  # fmt: skip
        policy = agent_policy(
            tmp_path, "scripted", image, argv=SCRIPTED_ARGV, usage="claude-code",
            secrets=[{"env": "API_KEY", "fromEnv": "AGENT_TEST_KEY"}], allow=[allowed],
            egress=server.egress(proxyImage=checkout_proxy_image()),
            **SCRIPTED_RUNTIME,
        )  # fmt: skip
        state = tmp_path / "state"
        proc, env, job = run_with_key(contract, policy, state, key)
        ledger = [json.loads(x) for x in (job / "record" / "ledger.jsonl").read_text().splitlines()]
        slot = next(e for e in ledger if e["type"] == "attempt.starting")["data"]["egress"]
        logs = docker("logs", f"{slot['slot']}-proxy")
        assert logs.returncode == 0, logs.stderr
        asked = server.requests()
    return LeakingRun(proc, env, job, state, policy, logs.stdout + logs.stderr, asked)
