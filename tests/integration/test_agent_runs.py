"""Agent-planned runs with the scripted agent runtime (images/agent-scripted), through
`runner run` and the real engine (issue 15): the whole path without an API key, the agent's
limits enforced by the runner from its transcript and kept across attempts, and the host's
secret nowhere in what the run leaves."""

from __future__ import annotations

import hashlib
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from runner.contract import Trust, load_contract
from runner.planning.plan import default_job_id
from tests.support import run_cli, run_job, session_containers, start_job
from tests.support.agents import (
    EXAMPLE,
    SCRIPTED_ARGV,
    SCRIPTED_RUNTIME,
    agent_contract,
    agent_policy,
    files_holding,
    members_holding,
    transcript_events,
)

pytestmark = pytest.mark.docker

SECRET = "sk-test-made-up-for-this-test-4f1c9a7e"  # noqa: S105 - made up here, never real


def _policy(folder: Path, image: str, **adapter: Any) -> list[str]:
    path = agent_policy(
        folder,
        "scripted",
        image,
        argv=SCRIPTED_ARGV,
        usage="claude-code",
        **{**SCRIPTED_RUNTIME, **adapter},
    )
    return ["--policy", str(path)]


def _assistant_turns(path: Path) -> int:
    return sum(1 for e in transcript_events(path) if e.get("type") == "assistant")


def test_the_scripted_agent_runs_the_evaluation_end_to_end(
    tmp_path: Path, scripted_agent_image: str, image_id: str
) -> None:
    """0.819 parsed from the evidence the agent's own command produced, its result.json
    checked against the contract, its transcript kept and hashed, its usage recorded; the
    host's secret reaches the agent (it checks its length) and nowhere else: not the job
    folder, not the record, not the envelope, not the exported bundle, even though the agent
    printed it (the runner redacts it from the transcript)."""
    text = (
        (EXAMPLE / "prompt.scripted.md")
        .read_text()
        .replace(
            "run: mkdir -p /job/output/logs",
            'run: test "${#API_KEY}" -gt 20\nrun: echo "my key is $API_KEY"\n'
            "run: mkdir -p /job/output/logs",
        )
    )
    contract = agent_contract(tmp_path, prompt=text, agent={"maxTurns": 40, "maxBudgetUsd": 3})
    secret = [{"env": "API_KEY", "fromEnv": "AGENT_TEST_KEY"}]
    code, env, err = run_job(
        contract,
        tmp_path / "state",
        *_policy(tmp_path, scripted_agent_image, secrets=secret),
        env={"AGENT_TEST_KEY": SECRET},
    )
    assert code == 0, (env["failure"], err)
    assert env["status"] == "succeeded"
    assert env["measurements"][0]["value"] == 0.819
    assert env["measurements"][0]["evidence"]["path"] == "logs/evaluation.log"
    assert env["agentResult"]["valid"] is True, env["agentResult"]
    assert env["agentResult"]["claim"]["execution"]["status"] == "succeeded"
    # what ran: the contract's image, the host's runtime brought into it, with its argv
    assert env["image"]["id"] == image_id
    agent = env["agent"]
    assert agent["runtime"] == "scripted" and agent["contractImage"] == image_id
    assert agent["runIn"] == "contract-image" and agent["commandsImageId"] == image_id
    assert agent["agentRuntime"]["image"]["id"] == scripted_agent_image
    assert agent["argv"][3:] == ["/job/input/prompt.md", "--max-turns", "40",
                                 "--max-budget-usd", "3"]  # fmt: skip
    assert env["allocation"]["agent"] == {
        "runtime": "scripted", "maxTurns": 40, "maxBudgetUsd": 3.0, "turnsUsed": 0,
        "costUsdUsed": 0.0,
    }  # fmt: skip
    # the transcript: its stdout, tool calls included, hashed into the envelope
    job = Path(env["jobDir"])
    transcript = job / "output" / agent["transcript"]
    events = transcript_events(transcript)
    calls = [
        block["input"]["command"]
        for e in events
        if e.get("type") == "assistant"
        for block in e["message"]["content"]
        if block.get("type") == "tool_use" and block["name"] == "Bash"
    ]
    assert any("evaluate.py --checkpoint" in c for c in calls), calls
    assert events[-1]["type"] == "result" and events[-1]["subtype"] == "success"
    assert b"[redacted: API_KEY]" in transcript.read_bytes()
    log = next(x for x in env["logs"] if x["path"] == agent["transcript"])
    assert log["sha256"] == "sha256:" + hashlib.sha256(transcript.read_bytes()).hexdigest()
    # usage, in the ledger and the envelope
    turns = _assistant_turns(transcript)
    usage = env["agentUsage"]
    assert usage["source"] == "claude-code"
    assert (usage["turns"], usage["maxTurns"], usage["costUsd"]) == (turns, 40, 0.0)
    assert [a["attempt"] for a in usage["attempts"]] == [1]
    ledger = [json.loads(x) for x in (job / "record" / "ledger.jsonl").read_text().splitlines()]
    used = [e["data"] for e in ledger if e["type"] == "agent.usage"]
    assert used == [{**used[0], "attempt": 1, "turns": turns, "totalTurns": turns}]
    # the prompt is an input like the others: staged, in the manifest
    manifest = json.loads((job / "execution" / "input-manifest.json").read_text())
    assert "prompt.md" in {f["path"] for f in manifest["files"]}
    assert (job / "input" / "prompt.md").read_text() == text
    # the secret: nowhere in the job folder, nor in its bundle
    assert files_holding(job, SECRET.encode()) == []
    archive = tmp_path / "run.tar.gz"
    exported = run_cli("export", str(job), "-o", str(archive), "--with-inputs")
    assert exported.returncode == 0, exported.stderr
    assert members_holding(archive, SECRET.encode()) == []
    assert SECRET not in err
    assert not session_containers()


RUNAWAY = "repeat: echo once more\npause: 0.05\nignore-limits: yes\n"


def test_an_agent_past_its_turns_is_stopped_by_the_runner(
    tmp_path: Path, scripted_agent_image: str
) -> None:
    """A runtime that ignores --max-turns is stopped by the runner itself from its transcript:
    resource_exhausted naming agent.maxTurns, usage in the ledger and the envelope; the job
    is over (a plain run shows its envelope), and --rerun starts nothing: the turns are
    spent over every attempt."""
    contract = agent_contract(tmp_path, prompt=RUNAWAY, agent={"maxTurns": 5})
    policy = _policy(tmp_path, scripted_agent_image)
    started = time.monotonic()
    code, env, err = run_job(contract, tmp_path / "state", *policy)
    assert time.monotonic() - started < 60
    assert code == 1, err
    failure = env["failure"]
    assert (failure["category"], failure["stage"]) == ("resource_exhausted", "container")
    assert "agent.maxTurns" in failure["reason"], failure
    usage = env["agentUsage"]
    assert usage["turns"] > 5 and usage["attempts"][0]["stoppedFor"] == "agent.maxTurns"
    job = Path(env["jobDir"])
    assert usage["turns"] == _assistant_turns(job / "output" / "logs" / "stdout.log")
    assert env["container"]["stoppedByRunner"] is False  # stopped for a limit, not the clock
    assert not session_containers()
    again = run_job(contract, tmp_path / "state", *policy)
    assert again[0] == 1 and again[1]["agentUsage"] == usage  # the stored envelope
    code, rerun, err = run_job(contract, tmp_path / "state", *policy, "--rerun")
    assert code == 1, err
    assert rerun["failure"]["category"] == "resource_exhausted"
    assert rerun["failure"]["stage"] == "stage"
    assert (
        "agent.maxTurns" in rerun["failure"]["reason"]
        and "nothing is left" in (rerun["failure"]["reason"])
    )
    assert rerun["agentUsage"]["turns"] == usage["turns"]
    ledger = (job / "record" / "ledger.jsonl").read_text().splitlines()
    assert sum(json.loads(x)["type"] == "attempt.starting" for x in ledger) == 1  # none since


def test_an_agent_past_its_budget_is_stopped_from_its_token_usage(
    tmp_path: Path, scripted_agent_image: str
) -> None:
    """The runtime reports no cost until it ends; the runner prices the usage its transcript
    shows with the adapter's prices and stops it past agent.maxBudgetUsd."""
    prompt = RUNAWAY + "tokens-per-turn: 1000000 0\n"
    contract = agent_contract(tmp_path, prompt=prompt, agent={"maxBudgetUsd": 2.5})
    policy = _policy(tmp_path, scripted_agent_image, prices={"inputPerMTok": 1.0})
    code, env, err = run_job(contract, tmp_path / "state", *policy)
    assert code == 1, err
    assert env["failure"]["category"] == "resource_exhausted"
    assert "agent.maxBudgetUsd" in env["failure"]["reason"]
    usage = env["agentUsage"]
    assert usage["costUsd"] > 2.5 and usage["attempts"][0]["reportedCostUsd"] is None
    assert usage["attempts"][0]["stoppedFor"] == "agent.maxBudgetUsd"


def test_a_second_attempt_starts_from_the_cumulative_usage(
    tmp_path: Path, scripted_agent_image: str
) -> None:
    """Attempt 1 is interrupted after a few turns; attempt 2 is given what is left (its argv,
    its compute decision), and the runtime stops itself there: the turns add up to the
    contract's, over both attempts."""
    prompt = "repeat: echo once more\npause: 0.3\n"
    contract = agent_contract(tmp_path, prompt=prompt, agent={"maxTurns": 12})
    policy = _policy(tmp_path, scripted_agent_image)
    state = tmp_path / "state"
    job = state / "jobs" / default_job_id(load_contract(contract, Trust()))
    proc = start_job(contract, state, *policy)
    try:
        deadline = time.monotonic() + 120
        live = job / "record" / "attempts" / "1" / "transcript.jsonl"  # the runner's capture
        while not (live.exists() and _assistant_turns(live) >= 4):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the agent took no turns"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    first = json.loads(out)["agentUsage"]["turns"]
    assert 4 <= first < 12
    code, env, err = run_job(contract, state, *policy)
    assert code == 1, err
    assert env["failure"]["category"] == "resource_exhausted"
    assert "agent.maxTurns" in env["failure"]["reason"]
    left = 12 - first
    assert env["allocation"]["agent"]["turnsUsed"] == first
    assert env["allocation"]["agent"]["maxTurns"] == left
    argv = env["agent"]["argv"]
    assert argv[argv.index("--max-turns") + 1] == str(left)
    usage = env["agentUsage"]
    assert [(a["attempt"], a["turns"]) for a in usage["attempts"]] == [(1, first), (2, left)]
    assert usage["turns"] == 12 and usage["attempts"][1]["stoppedFor"] == "agent.maxTurns"
    kept = job / "record" / "attempts" / "1" / "streams" / "logs" / "stdout.log"
    assert _assistant_turns(kept) == first  # attempt 1's transcript, kept whole
