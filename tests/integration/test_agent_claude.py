"""A real agent runtime against a scripted model (issue 15): Claude Code, the pinned native
binary built into runner-agent-claude:local by scripts/setup.sh, run by `runner run` in its
sealed container, driven by a scripted Messages API server (tests/support/model_server.py)
that the test starts as a container of its own on an internal network (the test's stand-in
for the outside: it has no route out).

The job reaches the model only through the egress allowlist proxy: the adapter's `allow` names
the model's host:port, the policy's egress names the model's network as the proxy's upstream,
and the job itself sits on its own internal network with no route and no outside DNS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import run_cli, run_job, session_containers
from tests.support.agents import (
    CLAUDE_ARGV,
    CLAUDE_RUNTIME,
    agent_contract,
    agent_policy,
    files_holding,
    members_holding,
    model_server,
    transcript_events,
)

pytestmark = pytest.mark.docker

API_KEY = "sk-ant-test-made-up-for-this-test-9d2e"  # not a real key


def _run(
    tmp_path: Path, image: str, scenario: str, agent: dict[str, Any], *extra: str
) -> tuple[int, dict[str, Any], str, list[dict[str, Any]]]:
    contract = agent_contract(
        tmp_path,
        runtime="claude-code",
        prompt=(Path(__file__).parents[2] / "examples/agent-evaluation/prompt.md").read_text(),
        agent={"model": "claude-sonnet-4-5", "effort": "low", **agent},
        change=lambda d: d["environment"].update(memoryGb=2, timeoutMinutes=5),
    )
    key_file = tmp_path / "anthropic-api-key"  # a host file, outside the job folder
    key_file.write_text(API_KEY + "\n")
    with model_server(tmp_path, scenario) as server:
        policy = agent_policy(
            tmp_path,
            "claude-code",
            image,
            argv=CLAUDE_ARGV,
            **CLAUDE_RUNTIME,
            env={"ANTHROPIC_BASE_URL": server.base_url, "CLAUDE_CODE_MAX_RETRIES": "0"},
            secrets=[{"env": "ANTHROPIC_API_KEY", "file": str(key_file)}],
            allow=[f"{server.host}:{server.port}"],
            usage="claude-code",
            egress=server.egress(),
        )
        code, env, err = run_job(
            contract,
            tmp_path / "state",
            "--policy",
            str(policy),
            *extra,
        )
        return code, env, err, server.requests()


def test_claude_code_driven_by_a_scripted_model_runs_the_evaluation(
    tmp_path: Path, claude_agent_image: str
) -> None:
    code, env, err, requests = _run(tmp_path, claude_agent_image, "evaluate", {"maxTurns": 10})
    assert code == 0, (env["failure"], err)
    assert env["status"] == "succeeded"
    assert env["measurements"][0]["value"] == 0.819
    assert env["agentResult"]["valid"] is True, env["agentResult"]
    # the model's traffic: three turns, each with the key the host injected
    turns = [r for r in requests if r["method"] == "POST" and r.get("main")]
    assert [r["turn"] for r in turns] == [0, 1, 2]
    assert all(r["apiKey"] for r in turns)
    usage = env["agentUsage"]
    assert usage["turns"] == 3 and usage["attempts"][0]["reportedTurns"] == 3
    assert usage["costUsd"] > 0  # Claude Code priced the usage the model reported
    # every model request went through the allowlist proxy, which counted them
    assert env["egress"]["refused"] == 0 and env["egress"]["allowed"] >= len(turns)
    assert {c["host"] for c in env["egress"]["connections"]} == {"model.test"}
    assert usage["requests"] == env["egress"]["allowed"]
    job = Path(env["jobDir"])
    events = transcript_events(job / "output" / env["agent"]["transcript"])
    assert events[0]["type"] == "system" and events[0]["claude_code_version"] == "2.1.332"
    assert events[-1]["type"] == "result" and events[-1]["subtype"] == "success"
    assert env["agent"]["argv"][:2] == ["/opt/runner-agent/run-claude", "/job/input/prompt.md"]
    assert env["agent"]["runIn"] == "contract-image"
    assert env["agent"]["agentRuntime"]["image"]["id"] == claude_agent_image
    # the key: nowhere in the job folder (record, envelope, transcript), nor in its bundle
    assert files_holding(job, API_KEY.encode()) == []
    archive = tmp_path / "run.tar.gz"
    exported = run_cli("export", str(job), "-o", str(archive), "--with-inputs")
    assert exported.returncode == 0, exported.stderr
    assert members_holding(archive, API_KEY.encode()) == []
    assert API_KEY not in err
    assert not session_containers()


def test_a_model_that_never_stops_ends_at_max_turns(
    tmp_path: Path, claude_agent_image: str
) -> None:
    """Claude Code stops itself at the --max-turns the runner passed; the runner reads that
    from its result and ends the attempt resource_exhausted naming agent.maxTurns."""
    code, env, err, requests = _run(tmp_path, claude_agent_image, "runaway", {"maxTurns": 3})
    assert code == 1, err
    assert env["failure"]["category"] == "resource_exhausted"
    assert "agent.maxTurns" in env["failure"]["reason"]
    usage = env["agentUsage"]
    assert usage["attempts"][0]["stoppedFor"] == "agent.maxTurns"
    # turns are the model's answers (Claude Code's own num_turns says one more)
    assert usage["turns"] == 3 and usage["attempts"][0]["reportedTurns"] == 4
    assert len([r for r in requests if r.get("main")]) == 3
    assert "3 turns (model answers" in env["failure"]["reason"]


def test_a_model_past_the_budget_is_stopped_and_a_rerun_starts_from_the_cost(
    tmp_path: Path, claude_agent_image: str
) -> None:
    """The scripted model reports a million output tokens a turn: Claude Code prices that past
    --max-budget-usd and stops; the cost is recorded, and a rerun is refused before anything
    starts because the budget is spent over every attempt."""
    code, env, err, _ = _run(tmp_path, claude_agent_image, "expensive", {"maxBudgetUsd": 3})
    assert code == 1, err
    assert env["failure"]["category"] == "resource_exhausted"
    assert "agent.maxBudgetUsd" in env["failure"]["reason"]
    usage = env["agentUsage"]
    assert usage["costUsd"] > 3 and usage["attempts"][0]["reportedCostUsd"] == usage["costUsd"]
    code, again, err, requests = _run(
        tmp_path, claude_agent_image, "expensive", {"maxBudgetUsd": 3}, "--rerun"
    )
    assert code == 1, err
    assert again["failure"]["stage"] == "stage" and "nothing is left" in again["failure"]["reason"]
    assert again["agentUsage"]["costUsd"] == usage["costUsd"]
    assert requests == []  # the model was never asked
