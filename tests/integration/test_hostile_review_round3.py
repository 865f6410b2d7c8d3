"""The hostile review of issue 25's fixes (third round): each hole found, as a regression
test. The agent guard, the redaction step, the input cache and the tools they touch, attacked
as a hostile job, agent prompt, contract author and local user would.

The tests that need no engine are in tests/unit/test_hostile_review_round3.py."""

from __future__ import annotations

import json
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_hostile_agent_guard import _answers, _policy, _short
from tests.support import docker, run_job, session_containers
from tests.support.agents import (
    agent_contract,
    checkout_proxy_image,
    model_server,
    run_with_key,
)
from tests.support.hostile import record
from tests.unit.test_hostile_review_round3 import (
    MARK,
)
from tests.unit.test_hostile_secrets import KEY, holding

# --- the guard: the proxy's count past the cap on its lease's log --------------------------

_FLOOD = r"""
import os, socket, sys
host, port = os.environ["HTTP_PROXY"].removeprefix("http://").rstrip("/").split(":")

def ask(target):
    s = socket.create_connection((host, int(port)), timeout=20)
    s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    while s.recv(65536):
        pass
    s.close()

for i in range(12):  # refused: each is two lines of the proxy's log, past its cap
    ask(f"http://refused-{i}.test/" + "p" * 100)
for i in range(8):  # the model's host: each at least one turn
    ask(f"http://{sys.argv[1]}/v1/ping")
"""


def _small_log_proxy_image() -> str:
    """The checkout's proxy with a 2 KiB cap on each lease's log (built once, offline)."""
    base = checkout_proxy_image()
    tag = base + "-log2k"
    if docker("image", "inspect", tag).returncode != 0:
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "Dockerfile").write_text(
                f"FROM {base}\nENV EGRESS_LEASE_LOG_BYTES=2048\n"
            )
            built = docker("build", "--network", "none", "-q", "-t", tag, folder)
            assert built.returncode == 0, built.stderr
    return tag


@pytest.mark.docker
@pytest.mark.hostile
def test_a_job_that_floods_the_proxys_log_past_its_cap_is_stopped(
    tmp_path: Path, scripted_agent_image: str
) -> None:
    """Before: past the cap on its lease's log the proxy logs nothing more of the lease, and
    the runner's live count of model requests stopped there: a job that first filled the log
    with refused requests made its model requests uncounted (each turn here makes eight, and
    it ran until its answers alone passed maxTurns). Now a capped lease's log fails the guard
    closed (agent.transcript), naming why."""
    (tmp_path / "repository").mkdir()
    (tmp_path / "repository" / "flood.py").write_text(_FLOOD)
    with model_server(tmp_path, "evaluate") as server:
        allowed = f"{server.host}:{server.port}"
        prompt = f"repeat: python3 repository/flood.py {allowed}\npause: 0.5\nignore-limits: yes\n"
        contract = agent_contract(tmp_path, prompt=prompt, agent={"maxTurns": 20}, change=_short)
        policy = _policy(
            tmp_path,
            scripted_agent_image,
            allow=[allowed],
            egress=server.egress(proxyImage=_small_log_proxy_image()),
        )
        code, env, err = run_job(contract, tmp_path / "state", *policy)
        served = len(server.requests())
    record("proxy-log-flooded-past-its-cap", "runc", env, served=served)
    job = Path(env["jobDir"])
    answers = _answers(job / "record" / "attempts" / "1" / "transcript.jsonl")
    usage: dict[str, Any] = env["agentUsage"]
    assert code == 1, (env.get("failure"), err)
    assert env["failure"]["category"] == "resource_exhausted", env["failure"]
    assert usage["attempts"][0]["stoppedFor"] == "agent.transcript", (usage, answers, served)
    assert "proxy" in env["failure"]["reason"] and "cap" in env["failure"]["reason"], env
    assert answers <= 12, (answers, served)  # before: until its answers passed 20
    assert not session_containers()


# A background process of the job writes into the agent runtime's stdout (the container's,
# through /proc/1/fd/1: the same pipe the engine reads), a byte at a time and no line break,
# so that each line the runtime prints starts with junk and no longer parses.
_INJECT = (
    'preflight runtime: python3 -c "import json"\n'
    "preflight checkpoint: true\n"
    "run: sh -c 'while :; do printf x; sleep 0.002; done' "
    "</dev/null >/proc/1/fd/1 2>/dev/null &\n"
)


@pytest.mark.docker
@pytest.mark.hostile
def test_junk_written_into_the_runtimes_stdout_does_not_lift_max_turns(
    tmp_path: Path, scripted_agent_image: str
) -> None:
    """The job writes into its agent runtime's stdout (/proc/1/fd/1, the pipe the engine
    reads): a runtime whose model waits between its tool result and its next answer (Claude
    Code) has each answer hidden behind the junk. Before: nothing noticed (here the scripted
    runtime, with no such wait, was stopped at maxTurns by the answers the junk missed). Now
    the first line that is no JSON object stops the agent, agent.transcript, naming why."""
    prompt = _INJECT + "repeat: true\npause: 0.05\nignore-limits: yes\n"
    contract = agent_contract(tmp_path, prompt=prompt, agent={"maxTurns": 20}, change=_short)
    started = time.monotonic()
    code, env, err = run_job(contract, tmp_path / "state", *_policy(tmp_path, scripted_agent_image))
    took = time.monotonic() - started
    record("junk-in-the-runtimes-stdout", "runc", env, seconds=round(took, 1))
    usage: dict[str, Any] = env["agentUsage"]
    job = Path(env["jobDir"])
    answers = _answers(job / "record" / "attempts" / "1" / "transcript.jsonl")
    assert code == 1, (env.get("failure"), err, usage, answers)
    assert env["failure"]["category"] == "resource_exhausted", (env["failure"], usage, took)
    assert usage["attempts"][0]["stoppedFor"] == "agent.transcript", (usage, answers)
    assert "no JSON object" in env["failure"]["reason"], env["failure"]
    assert answers < 20 and took < 90, (answers, took)
    assert not session_containers()


# --- redaction through the engine: a stray "%\r" in the engine's log --------------------------

_STRAY = r"""
import os
key = os.environ["API_KEY"].encode()
with open("/proc/1/fd/2", "wb") as err:  # the container's stderr: the engine's log of it
    # a progress counter, each step ending in "\r": what follows is printed over it
    err.write(b"".join(b"%d%%\r" % i for i in range(101)))
    err.write(b"key=" + "".join(f"%{b:02x}" for b in key).encode() + b"\n")
"""


@pytest.mark.docker
@pytest.mark.hostile
def test_a_stray_percent_cr_in_the_engine_log_does_not_carry_the_key_out(
    tmp_path: Path, scripted_agent_image: str
) -> None:
    """The agent writes a progress counter ("1%\\r2%\\r..."), then its key percent-encoded, into
    its container's stderr (the engine's log, kept as record/attempts/1/engine.log and
    exported). Before: the redaction prefilter's decoder dropped the rest of a line after
    "%\\r", so the key went into the record and the bundle in clear (engine.log, both).
    Now neither holds it in any form."""
    from tests.support import run_cli
    from tests.support.agents import SCRIPTED_ARGV, SCRIPTED_RUNTIME, agent_policy
    from tests.unit.test_hostile_secrets import _files, _members

    (tmp_path / "repository").mkdir()
    (tmp_path / "repository" / "stray.py").write_text(_STRAY)
    prompt = (
        "preflight runtime: true\npreflight checkpoint: true\nrun: python3 repository/stray.py\n"
    )
    contract = agent_contract(tmp_path, prompt=prompt, agent={"maxTurns": 20}, change=_short)
    policy = agent_policy(
        tmp_path, "scripted", scripted_agent_image, argv=SCRIPTED_ARGV, usage="claude-code",
        secrets=[{"env": "API_KEY", "fromEnv": "AGENT_TEST_KEY"}], **SCRIPTED_RUNTIME,
    )  # fmt: skip
    state = tmp_path / "state"
    _, _, job = run_with_key(contract, policy, state, KEY)
    engine_log = (job / "record" / "attempts" / "1" / "engine.log").read_bytes()
    assert b"99%\r100%\r" in engine_log, engine_log[-400:]  # the job's bytes got there
    archive = tmp_path / "run.tar"
    exported = run_cli("export", str(job), "-o", str(archive))
    assert exported.returncode == 0, exported.stderr
    leaks = {f"state/{n}": f for n, d in _files(state).items() if (f := holding(d))}
    leaks |= {f"bundle/{n}": f for n, d in _members(archive).items() if (f := holding(d))}
    assert leaks == {}
    assert MARK.encode() in engine_log
    assert not session_containers()


# --- redaction after a reattach: secrets unset or rotated meanwhile --------------------------


@pytest.mark.docker
@pytest.mark.hostile
@pytest.mark.parametrize("then", ["unset", "rotated"])
def test_a_reattach_that_cannot_know_the_secret_keeps_and_exports_none_of_it(
    tmp_path: Path, scripted_agent_image: str, then: str
) -> None:
    """The agent prints its key each turn; the runner is killed (SIGKILL) mid-job, then the
    variable the secret comes from is unset, or holds a new key, when `runner run` picks the
    attempt up again. Before: the reattach read the secret again and redacted nothing (unset)
    or the new key (rotated), so the transcript, stdout.log and the engine's log in the job
    folder, and the bundle, held the key the container had. Now the attempt's start records
    a salted digest of each secret; a reattach that cannot show it holds the same values
    replaces the attempt's streams and logs by a note, warns in the envelope, and the run
    cannot be exported."""
    from runner.contract import Trust, load_contract
    from runner.planning.plan import default_job_id
    from tests.support import run_cli, start_job
    from tests.support.agents import SCRIPTED_ARGV, SCRIPTED_RUNTIME, agent_policy
    from tests.unit.test_hostile_secrets import _files

    prompt = "repeat: echo key=$API_KEY\npause: 0.3\n"
    contract = agent_contract(tmp_path, prompt=prompt, agent={"maxTurns": 12}, change=_short)
    policy = agent_policy(
        tmp_path, "scripted", scripted_agent_image, argv=SCRIPTED_ARGV, usage="claude-code",
        secrets=[{"env": "API_KEY", "fromEnv": "AGENT_TEST_KEY"}], **SCRIPTED_RUNTIME,
    )  # fmt: skip
    state = tmp_path / "state"
    job = state / "jobs" / default_job_id(load_contract(contract, Trust()))
    live = job / "record" / "attempts" / "1" / "transcript.jsonl"
    proc = start_job(contract, state, "--policy", str(policy), env={"AGENT_TEST_KEY": KEY})
    try:
        deadline = time.monotonic() + 120
        while not (live.exists() and _answers(live) >= 3):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the agent took no turns"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    env = {"AGENT_TEST_KEY": "sk-rotated-" + "r" * 32} if then == "rotated" else {}
    _code, envelope, err = run_job(contract, state, "--policy", str(policy), env=env)
    record(f"reattach-secret-{then}", "runc", envelope)
    usage = envelope["agentUsage"]
    assert [a["attempt"] for a in usage["attempts"]] == [1], (usage, err)  # reattached
    leaks = {n: f for n, d in _files(state).items() if (f := holding(d))}
    assert leaks == {}, leaks  # before: the transcript, stdout.log, engine.log
    assert any("cannot be exported" in w for w in envelope["warnings"]), envelope["warnings"]
    assert b"withheld by the runner" in (job / "output" / "logs" / "stdout.log").read_bytes()
    exported = run_cli("export", str(job), "-o", str(tmp_path / "run.tar"))
    assert exported.returncode != 0 and "cannot be exported" in exported.stderr, exported
    assert not (tmp_path / "run.tar").exists()
    # a re-grade under another value of the secret than the attempts were given is refused
    # (it could not redact theirs: round 17), and the run stays unexportable
    regraded = run_cli("parse", str(job), "--policy", str(policy), "--json",
                       env={"AGENT_TEST_KEY": "sk-now-" + "n" * 32})  # fmt: skip
    assert regraded.returncode == 3 and "API_KEY" in regraded.stderr, regraded
    again = run_cli("export", str(job), "-o", str(tmp_path / "run.tar"))
    assert again.returncode != 0 and "cannot be exported" in again.stderr, again
    assert not session_containers()


_LONG_JUNK = """
import os
fd = os.open("/proc/1/fd/1", os.O_WRONLY)  # the container's stdout: the runtime's stream
junk = memoryview(b"x" * (1024 * 1024 + 1))  # no line break: the runtime's next line joins it
while junk:
    junk = junk[os.write(fd, junk) :]
"""


@pytest.mark.docker
@pytest.mark.hostile
def test_junk_over_a_mib_before_the_runtimes_lines_is_not_skipped(
    tmp_path: Path, scripted_agent_image: str
) -> None:
    """Each turn's command writes 1 MiB + 1 bytes without a line break into the runtime's
    stdout, so the next line it prints (here the tool's result; with Claude Code, whose
    model answers after a wait, the answer) joins a line over 1 MiB. Before: such a line was
    skipped without a word (here the agent ran on to maxTurns, agent.maxTurns, every result
    line hidden; an answer in it would not have been counted). Now the line is read (up to
    16 MiB), is no JSON object, and the agent is stopped, agent.transcript, naming why.
    (Through Docker the hole was also closed by chance: the engine's 1 MiB log file rotates
    inside such a line and the runner's stream of it lost a part, so a shorter piece was
    judged; the reader's own test above fails before the fix whatever the engine does.)"""
    (tmp_path / "repository").mkdir()
    (tmp_path / "repository" / "junk.py").write_text(_LONG_JUNK)
    prompt = (
        'preflight runtime: python3 -c "import json"\npreflight checkpoint: true\n'
        "repeat: python3 repository/junk.py\npause: 0.2\nignore-limits: yes\n"
    )
    contract = agent_contract(tmp_path, prompt=prompt, agent={"maxTurns": 8}, change=_short)
    started = time.monotonic()
    code, env, err = run_job(contract, tmp_path / "state", *_policy(tmp_path, scripted_agent_image))
    took = time.monotonic() - started
    record("long-junk-in-the-runtimes-stdout", "runc", env, seconds=round(took, 1))
    usage: dict[str, Any] = env["agentUsage"]
    assert code == 1, (env.get("failure"), err, usage)
    assert env["failure"]["category"] == "resource_exhausted", (env["failure"], usage, took)
    assert usage["attempts"][0]["stoppedFor"] == "agent.transcript", usage
    reason = env["failure"]["reason"]
    assert "no JSON object" in reason, reason
    assert "xxxx" not in reason and took < 90, (reason, took)
    assert not session_containers()


@pytest.mark.docker
@pytest.mark.hostile
def test_a_listing_removed_while_the_job_runs_ends_it_input_digest_mismatch(
    tmp_path: Path, image_id: str
) -> None:
    """A local user removes record/input-tree.json while the job runs. Before: the check of
    input/ after the job was skipped (inputsUnchanged null) and the run succeeded. Now it is
    input_digest_mismatch, exit 3, the reason naming the file."""
    from tests.support import start_job, wait_running
    from tests.unit.test_hostile_inputs_round3 import _value_contract

    contract = _value_contract(tmp_path / "c", image_id, pause="6")
    state = tmp_path / "state"
    proc = start_job(contract, state, "--job-id", "unlisted")
    wait_running(proc)
    (state / "jobs" / "unlisted" / "record" / "input-tree.json").unlink()
    out, err = proc.communicate(timeout=300)
    env: dict[str, Any] = json.loads(out)
    record("input listing removed during the job", "runc", env)
    assert proc.returncode == 3, (env.get("failure"), err)
    assert env["failure"]["category"] == "input_digest_mismatch", env["failure"]
    assert "record/input-tree.json" in env["failure"]["reason"], env["failure"]
    assert env["inputsUnchanged"] is False
    assert not session_containers()
