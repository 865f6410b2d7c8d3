"""Regression tests for the agent's turn and cost guard (issue 25, items 2, 3 and 12).

Before: the guard read the transcript from ``/job/output``, which the job can write, so a
runaway agent that deleted it (or put a link to /dev/null in its place) ran its whole time
budget with ``stoppedFor: null``; the reader kept every distinct message id whole, so a
transcript of long ids grew the runner's memory with the job's input; turns were the higher
of the answers seen and the runtime's ``num_turns`` (one more than the answers at Claude
Code's --max-turns); the ledger's ``agent.usage`` had ``requests: null`` where the envelope
had the proxy's count. Now the guard reads the runner's own capture of the container's stdout
(outside every folder the job can reach), floors turns by the egress proxy's count of model
requests, live, and fails closed when a transcript it read vanishes or is replaced.

The tests that need no engine are in tests/unit/test_hostile_agent_guard.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from runner.agents import transcript
from runner.contract import Trust, load_contract
from runner.planning.plan import default_job_id
from tests.support import run_job, session_containers, start_job
from tests.support.agents import (
    SCRIPTED_ARGV,
    SCRIPTED_RUNTIME,
    agent_contract,
    agent_policy,
    model_server,
    transcript_events,
)
from tests.support.hostile import record

MIB = 1024 * 1024


def _answers(path: Path) -> int:
    return len(
        {e["message"]["id"] for e in transcript_events(path) if e.get("type") == "assistant"}
    )


def _policy(folder: Path, image: str, **adapter: Any) -> list[str]:
    path = agent_policy(
        folder, "scripted", image, argv=SCRIPTED_ARGV, usage="claude-code",
        **{**SCRIPTED_RUNTIME, **adapter},
    )  # fmt: skip
    return ["--policy", str(path)]


def _short(data: dict[str, Any]) -> None:
    data["environment"]["timeoutMinutes"] = 2  # before: the whole of it, then `timeout`


def _ledger_usage(job: Path) -> list[dict[str, Any]]:
    lines = (job / "record" / "ledger.jsonl").read_text().splitlines()
    return [e["data"] for e in map(json.loads, lines) if e["type"] == "agent.usage"]


# --- item 2: a transcript the job deletes or replaces -------------------------------------------


@pytest.mark.docker
@pytest.mark.hostile
@pytest.mark.parametrize(
    "tamper",
    [
        "rm -f /job/output/logs/stdout.log",
        "rm -f /job/output/logs/stdout.log; ln -s /dev/null /job/output/logs/stdout.log",
        ": > /job/output/logs/stdout.log",
    ],
    ids=["deleted", "link-to-dev-null", "truncated"],
)
def test_a_runaway_that_tampers_with_its_transcript_is_stopped_at_max_turns(
    tmp_path: Path, scripted_agent_image: str, tamper: str
) -> None:
    """The agent ignores --max-turns and, at every turn, deletes (or links away, or
    truncates) /job/output/logs/stdout.log. Its stdout is the container's, read by the runner
    from the engine: it is stopped at agent.maxTurns within seconds, stoppedFor set in the
    envelope and the ledger, and the copy in output/ is the runner's capture, whole."""
    prompt = f"repeat: {tamper}\npause: 0.05\nignore-limits: yes\n"
    contract = agent_contract(tmp_path, prompt=prompt, agent={"maxTurns": 5}, change=_short)
    started = time.monotonic()
    code, env, err = run_job(contract, tmp_path / "state", *_policy(tmp_path, scripted_agent_image))
    took = time.monotonic() - started
    record("agent-deletes-its-transcript", "runc", env, seconds=round(took, 1), tamper=tamper)
    assert code == 1, (env.get("failure"), err)
    failure = env["failure"]
    assert failure["category"] == "resource_exhausted", failure
    assert "agent.maxTurns" in failure["reason"] and "model answers" in failure["reason"]
    usage = env["agentUsage"]
    assert usage["attempts"][0]["stoppedFor"] == "agent.maxTurns", usage
    assert 5 < usage["turns"] < 60, usage  # before: ~580 turns, stoppedFor null
    assert took < 90  # before: the whole 2-minute budget, then `timeout`
    job = Path(env["jobDir"])
    capture = job / "record" / "attempts" / "1" / "transcript.jsonl"
    assert _answers(capture) == usage["turns"]
    copy = job / "output" / "logs" / "stdout.log"
    assert copy.is_file() and not copy.is_symlink()
    assert copy.read_bytes() == capture.read_bytes()
    [used] = _ledger_usage(job)
    assert used["stoppedFor"] == "agent.maxTurns" and used["turns"] == usage["turns"]
    assert used["answers"] == usage["turns"]
    assert not session_containers()


# --- item 2 (floor) and item 12 (requests): the proxy's count of model requests ------------------

_REQUESTS = (
    "python3 -c 'exec(\"import urllib.request as u\\nfor i in range(8):\\n try: "
    'u.urlopen(\\"http://model.test:8080/v1/ping\\", timeout=10).read()\\n '
    "except Exception: pass\")'"
)


@pytest.mark.docker
@pytest.mark.hostile
def test_model_requests_through_the_proxy_floor_the_turns_live(
    tmp_path: Path, scripted_agent_image: str
) -> None:
    """Each turn of this agent makes eight requests of its model's host and prints one answer:
    its transcript shows far fewer turns than the model served. The proxy's count is a hard
    floor on turns, read live: it is stopped at agent.maxTurns long before its answers reach
    the limit, and the ledger's agent.usage names the same request count as the envelope."""
    prompt = f"repeat: {_REQUESTS}\npause: 0.5\nignore-limits: yes\n"
    contract = agent_contract(tmp_path, prompt=prompt, agent={"maxTurns": 20}, change=_short)
    with model_server(tmp_path, "evaluate") as server:
        policy = _policy(
            tmp_path,
            scripted_agent_image,
            allow=[f"{server.host}:{server.port}"],
            egress=server.egress(),
        )
        code, env, err = run_job(contract, tmp_path / "state", *policy)
        served = len(server.requests())
    assert code == 1, (env.get("failure"), err)
    assert env["failure"]["category"] == "resource_exhausted", env["failure"]
    usage = env["agentUsage"]
    attempt = usage["attempts"][0]
    assert attempt["stoppedFor"] == "agent.maxTurns", usage
    job = Path(env["jobDir"])
    [used] = _ledger_usage(job)
    assert used["requests"] == attempt["requests"]  # before: null in the ledger
    answers = _answers(job / "record" / "attempts" / "1" / "transcript.jsonl")
    assert answers <= 12, answers  # before: stopped only once its answers passed 20
    assert attempt["requests"] > 20 and usage["turns"] >= attempt["requests"]
    assert served >= 20
    assert used["answers"] == answers and used["turns"] == usage["turns"]
    assert env["egress"]["allowed"] == attempt["requests"]
    assert not session_containers()


@pytest.mark.docker
@pytest.mark.hostile
def test_a_runner_killed_while_the_agent_runs_reattaches_to_its_stream(
    tmp_path: Path, scripted_agent_image: str
) -> None:
    """The runner is killed (SIGKILL) while the agent runs; the next `runner run` reattaches:
    it reads the earlier capture, then the engine's stream again, so the capture holds every
    answer once and the turns are the runtime's own stop at --max-turns."""
    prompt = "repeat: echo once more\npause: 0.3\n"
    contract = agent_contract(tmp_path, prompt=prompt, agent={"maxTurns": 12}, change=_short)
    policy = _policy(tmp_path, scripted_agent_image)
    state = tmp_path / "state"
    job = state / "jobs" / default_job_id(load_contract(contract, Trust()))
    live = job / "record" / "attempts" / "1" / "transcript.jsonl"
    proc = start_job(contract, state, *policy)
    try:
        deadline = time.monotonic() + 120
        while not (live.exists() and _answers(live) >= 3):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the agent took no turns"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    code, env, err = run_job(contract, state, *policy)
    assert code == 1, (env.get("failure"), err)
    usage = env["agentUsage"]
    assert [a["attempt"] for a in usage["attempts"]] == [1]  # the same attempt, reattached
    assert usage["turns"] == 12 and usage["attempts"][0]["stoppedFor"] == "agent.maxTurns"
    lines = [e for e in transcript_events(live) if e.get("type") == "assistant"]
    assert len(lines) == _answers(live) == 12  # each answer once
    assert (job / "output" / "logs" / "stdout.log").read_bytes() == live.read_bytes()
    assert not session_containers()


# --- item 3: the reader's memory ----------------------------------------------------------------

_MEASURE = textwrap.dedent(
    """
    import json, os, resource, sys
    from pathlib import Path
    from runner.agents import transcript

    def rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def lines(n, size, tag, pad="x"):
        for i in range(n):
            mid = f"{tag}{i:09d}".ljust(size, pad)
            yield (json.dumps({"type": "assistant",
                               "message": {"id": mid, "usage": {"input_tokens": 1}}})
                   + "\\n").encode()

    reader = transcript.Reader(transcript.Prices(input=1.0))
    reader.feed(next(lines(1, 1000, "warm")))
    reader.usage()
    base = rss()
    fed = 0
    # 320 distinct ids of almost 1 MiB each, then 400,000 distinct 200-byte ids
    for chunk in lines(320, 1024 * 1024 - 200, "long"):
        reader.feed(chunk)
        fed += len(chunk)
    for chunk in lines(400_000, 200, "short"):
        reader.feed(chunk)
        fed += len(chunk)
    usage = reader.usage()
    streamed = rss() - base
    # truncate-and-rewrite, through the file meter: 64 MiB, cut to nothing, written again
    root = Path(sys.argv[1])
    path = root / "t.jsonl"
    with path.open("wb") as f:
        for chunk in lines(64, 1024 * 1024 - 200, "file"):
            f.write(chunk)
    meter = transcript.Meter(root, "t.jsonl")
    meter.drain()
    with path.open("wb") as f:
        for chunk in lines(65, 1024 * 1024 - 200, "again", pad="y"):
            f.write(chunk)
    after = meter.drain()
    print(json.dumps({"fed": fed, "turns": usage.turns, "streamed": streamed,
                      "total": rss() - base, "tampered": getattr(after, "tampered", None)}))
    """
)


@pytest.mark.slow  # 400+ MB of transcript through the reader in a fresh process
def test_the_readers_memory_stays_bounded_whatever_the_transcript_holds(tmp_path: Path) -> None:
    """Before: 900 MB of distinct 1 MB message ids drove the runner to 948 MB RSS. A fresh
    process feeds 400+ MB of distinct long and short ids through the reader and a
    truncate-and-rewrite through the file meter; its peak RSS grows by under 100 MB, every
    answer it could remember is counted, and the rewritten file fails closed."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["fed"] > 400 * MIB
    assert got["turns"] >= transcript.MAX_IDS  # counted, beyond what is remembered too
    assert got["streamed"] < 100 * MIB, got
    assert got["total"] < 100 * MIB, got
    assert got["tampered"], got
