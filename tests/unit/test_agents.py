"""Agent adapters, the agent's plan, its transcript and its usage: pure logic over files
(issue 15). The runs themselves are in test_agent_runs.py (scripted runtime) and
test_agent_claude.py (Claude Code against a scripted model)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from runner.agents import adapters as agents
from runner.agents import transcript
from runner.agents.adapters import AgentAdapter
from runner.backends.base import ContainerSpec
from runner.backends.fake import FakeBackend, FakeJob
from runner.contract import load_contract, with_digest
from runner.core.errors import HostConfigError, PolicyViolation, ProtocolAmbiguous
from runner.core.redaction import Redactor
from runner.execution import orchestrator
from runner.planning import plan, policy
from runner.planning.policy import HostPolicy
from runner.state.ledger import Ledger, LedgerCorrupt
from tests.support import ROOT, SEED, run_cli
from tests.support.agents import files_holding
from tests.support.crash import Crash, CrashingProgress

EXAMPLE = ROOT / "examples" / "agent-evaluation"
FIXTURES = ROOT / "tests" / "fixtures" / "agents"

SCRIPTED: dict[str, Any] = {
    "image": "sha256:" + "cd" * 32,
    "argv": [
        "python3",
        "/opt/runner-agent/agent.py",
        "--prompt",
        "{prompt}",
        ["--max-turns", "{maxTurns}"],
        ["--max-budget-usd", "{maxBudgetUsd}"],
        ["--model", "{model}"],
    ],
    "runtimePaths": ["/opt/runner-agent/agent.py"],
    "env": {"AGENT_MODE": "test"},
    "secrets": [{"env": "API_KEY", "fromEnv": "RUNNER_TEST_AGENT_KEY"}],
    "usage": "claude-code",
    "maxTurns": 50,
}


CONTRACT_IMAGE = "sha256:" + "ab" * 32


def _policy(**adapter: Any) -> HostPolicy:
    return HostPolicy.model_validate({"agents": {"scripted": {**SCRIPTED, **adapter}}})


def scripted_options(tmp_path: Path, image_id: str) -> orchestrator.RunOptions:
    """Run options of a host whose policy accepts unsigned contracts and has the scripted
    agent, run in its own image ``image_id``; fast ticks for the fake engine."""
    pol = HostPolicy.model_validate(
        {
            "acceptUnsigned": True,
            "agents": {"scripted": {**SCRIPTED, "image": image_id, "runIn": "adapter-image"}},
        }
    )
    return orchestrator.RunOptions(
        state_dir=tmp_path / "state",
        policy=policy.LoadedPolicy(pol.resolved(), "test"),
        tick_seconds=0.01,
        heartbeat_seconds=0.05,
        stop_grace_seconds=0.05,
    )


def _contract(tmp_path: Path, change: Any = None) -> Path:
    data = json.loads((EXAMPLE / "task.scripted.json").read_text())
    data["environment"]["image"] = CONTRACT_IMAGE
    if change is not None:
        change(data)
    data.pop("contractDigest")
    for name in ("paper.md", "prompt.scripted.md"):
        (tmp_path / name).write_bytes((EXAMPLE / name).read_bytes())
    shutil.copytree(EXAMPLE / "repository", tmp_path / "repository", dirs_exist_ok=True)
    path = tmp_path / "task.json"
    path.write_text(json.dumps(with_digest(data)))
    return path


def _plan(contract: Path, pol: HostPolicy) -> plan.ExecutionPlan:
    return plan.build(load_contract(contract), pol, job_id="j", host_uid=0, host_gid=0)


# --- the adapter in the host policy ---------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"argv": ["agent", "{apiKey}"]}, "placeholders are"),
        ({"argv": ["agent", []]}, "must not be empty"),
        ({"secrets": [{"env": "K"}]}, "exactly one of file and fromEnv"),
        ({"secrets": [{"env": "K", "file": "/k", "fromEnv": "K"}]}, "exactly one"),
        ({"secrets": [{"env": "K", "file": "relative/k"}]}, "absolute host path"),
        ({"env": {"RUNNER_JOB_ID": "x"}}, "RUNNER_"),
        ({"env": {"API_KEY": "x"}}, "named twice"),
        ({"network": "host"}, "network"),
        ({"allow": ["api.anthropic.com"]}, "allow"),
        ({"usage": "guess"}, "usage"),
    ],
)
def test_a_bad_adapter_is_refused_with_the_policy(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _policy(**change)


def test_a_policy_file_with_a_bad_adapter_is_the_hosts_error(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"agents": {"x": {**SCRIPTED, "argv": ["{secret}"]}}}))
    with pytest.raises(HostConfigError, match="agents"):
        policy.load(path)


def test_the_examples_policy_loads() -> None:
    loaded = policy.load(EXAMPLE / "policy.scripted.json")
    assert set(loaded.policy.agents) == {"scripted"}


def test_render_drops_a_group_without_a_value_and_never_expands_a_value_again() -> None:
    template: list[agents.TemplateItem] = ["a", "{prompt}", ["--model", "{model}"], "x={task}"]
    assert agents.render(template, {"prompt": "{task}", "task": "T"}) == ("a", "{task}", "x=T")
    with pytest.raises(KeyError):
        agents.render(["{model}"], {})


# --- the plan of an agent_planned contract ----------------------------------------------------


def test_an_unknown_runtime_is_refused_naming_what_the_host_offers(tmp_path: Path) -> None:
    contract = _contract(tmp_path, lambda d: d["agent"].update(runtime="other"))
    with pytest.raises(PolicyViolation, match=r"\$\.agent\.runtime.*'other'.*offers scripted"):
        _plan(contract, _policy())
    with pytest.raises(PolicyViolation, match="offers none"):
        _plan(contract, HostPolicy())


def test_no_runtime_is_ambiguous_and_no_prompt_gets_the_hosts(tmp_path: Path) -> None:
    def no_prompt(d: dict[str, Any]) -> None:
        del d["agent"]["promptPath"]

    def no_runtime(d: dict[str, Any]) -> None:
        del d["agent"]["runtime"]

    default = _plan(_contract(tmp_path, no_prompt), _policy()).agent  # the platform's
    assert default is not None and default.prompt_source == "default"
    assert default.prompt == "/job/input/agent-prompt.md"
    with pytest.raises(ProtocolAmbiguous, match=r"\$\.agent\.runtime"):
        _plan(_contract(tmp_path, no_runtime), _policy())


def test_the_plan_runs_the_adapter_with_the_contracts_limits(tmp_path: Path) -> None:
    """The image is the contract's, the runtime's image the adapter's, the argv the
    adapter's; the required fragments go to the agent (they are not matched against the
    runtime's argv); secrets are not in the plan. runIn adapter-image: today's way."""
    p = _plan(_contract(tmp_path), _policy())
    assert p.agent is not None
    assert p.image.image_id == CONTRACT_IMAGE
    assert p.agent_image is not None and p.agent_image.image_id == SCRIPTED["image"]
    own = _plan(_contract(tmp_path), _policy(runIn="adapter-image"))
    assert own.image.image_id == SCRIPTED["image"] and own.agent_image is None
    assert p.argv == (
        "python3",
        "/opt/runner-agent/agent.py",
        "--prompt",
        "/job/input/prompt.scripted.md",
        "--max-turns",
        "40",
        "--max-budget-usd",
        "3",
    )
    assert p.agent.contract_image == CONTRACT_IMAGE
    assert p.limits.network == "none"
    assert p.environment["AGENT_MODE"] == "test"
    assert p.environment["RUNNER_AGENT_PROMPT"] == "/job/input/prompt.scripted.md"
    assert "API_KEY" not in p.environment
    # what is left for a later attempt
    assert p.agent.argv(*p.agent.left(38, 2.5))[-4:] == (
        "--max-turns",
        "2",
        "--max-budget-usd",
        "0.5",
    )


def test_the_host_caps_the_agents_limits(tmp_path: Path) -> None:
    over = _contract(tmp_path, lambda d: d["agent"].update(maxTurns=51))
    with pytest.raises(PolicyViolation, match=r"\$\.agent\.maxTurns.*at most 50"):
        _plan(over, _policy())
    none = _contract(tmp_path, lambda d: d["agent"].update(maxTurns=None))
    agent = _plan(none, _policy()).agent
    assert agent is not None and agent.max_turns == 50  # the host's cap is the default


def test_a_template_value_the_contract_leaves_empty_is_named(tmp_path: Path) -> None:
    pol = _policy(argv=["agent", "--model", "{model}"])
    with pytest.raises(ProtocolAmbiguous, match=r"\$\.agent\.model"):
        _plan(_contract(tmp_path), pol)


def test_an_agent_network_is_refused_under_gvisor(tmp_path: Path) -> None:
    contract = _contract(tmp_path, lambda d: d["environment"].update(isolation="runsc"))
    with pytest.raises(PolicyViolation, match="runsc"):
        _plan(contract, _policy(network="agents-net"))
    assert _plan(_contract(tmp_path), _policy(network="agents-net")).limits.network == "agents-net"


def test_the_seed_contract_is_refused_on_a_host_without_its_runtime() -> None:
    proc = run_cli(
        "verify", str(SEED), "--allow-unsigned", "--allow-network", "--allow-unpinned-image"
    )
    assert proc.returncode == 3, proc.stderr
    assert "policy_violation" in proc.stderr and "$.agent.runtime" in proc.stderr


def test_runner_verify_accepts_the_scripted_example_with_its_policy() -> None:
    contract = str(EXAMPLE / "task.scripted.json")
    ok = run_cli(
        "verify",
        contract,
        "--allow-unsigned",
        "--allow-unpinned-image",
        "--policy",
        str(EXAMPLE / "policy.scripted.json"),
        "--json",
    )
    assert ok.returncode == 0, ok.stderr
    info = json.loads(ok.stdout)
    assert info["command"][:4] == [
        "python3",
        "/opt/runner-agent/agent.py",
        "--prompt",
        ("/job/input/prompt.scripted.md"),
    ]
    refused = run_cli("verify", contract, "--allow-unsigned")
    assert refused.returncode == 3 and "offers none" in refused.stderr


# --- the transcript -----------------------------------------------------------------------------


def _read(name: str, prices: transcript.Prices | None = None) -> transcript.Usage:
    reader = transcript.Reader(prices)
    reader.feed((FIXTURES / name).read_bytes())
    return reader.usage()


def test_claude_codes_own_stream_json_reports() -> None:
    """Captured from Claude Code 2.1.332 against the scripted model (fixtures/agents)."""
    done = _read("claude-evaluation.jsonl")
    assert (done.turns, done.reportedTurns, done.stoppedFor) == (3, 3, None)
    assert done.costUsd == pytest.approx(0.0018)
    turns = _read("claude-max-turns.jsonl")  # --max-turns 3: three answers, num_turns 4
    # turns are model answers, one way; the runtime's num_turns is kept beside
    assert (turns.turns, turns.reportedTurns, turns.stoppedFor) == (3, 4, "agent.maxTurns")
    assert turns.over(3, None) == "agent.maxTurns"
    budget = _read("claude-max-budget.jsonl")  # --max-budget-usd 3, a million output tokens
    assert budget.stoppedFor == "agent.maxBudgetUsd"
    assert budget.costUsd == pytest.approx(15.0003)


def test_turns_and_cost_are_read_from_the_stream_when_the_runtime_never_reports() -> None:
    """Turns are distinct main-thread message ids (a subagent's answers cost, but are not
    the agent's turns); cost is estimated from usage with the adapter's prices."""
    lines = [
        {"type": "assistant", "message": {"id": "m1", "usage": {"input_tokens": 10}}},
        {"type": "assistant", "message": {"id": "m1", "usage": {"output_tokens": 1}}},
        {"type": "assistant", "message": {"id": "m2", "usage": {"output_tokens": 1000}}},
        {
            "type": "assistant",
            "parent_tool_use_id": "t",
            "message": {"id": "sub", "usage": {"input_tokens": 1_000_000}},
        },
        {"type": "stream_event", "event": {"type": "message_start", "message": {"id": "m3"}}},
        {"type": "stream_event", "event": {"type": "message_delta", "usage": {"output_tokens": 9}}},
    ]
    reader = transcript.Reader(transcript.Prices(input=1.0, output=1000.0))
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    for i in range(0, len(data), 7):  # split anywhere: partial lines wait for their end
        reader.feed(data[i : i + 7])
    usage = reader.usage()
    assert usage.turns == 3
    assert usage.tokens == {"input": 1_000_010, "output": 1010, "cacheRead": 0, "cacheWrite": 0}
    assert usage.costUsd == pytest.approx(1.00001 + 1.01)
    assert usage.over(3, 2.5) is None and usage.over(2, None) == "agent.maxTurns"
    assert usage.over(None, 2.0) == "agent.maxBudgetUsd"


def test_junk_long_lines_and_a_replaced_file_do_not_derail_the_meter(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    log = out / "stdout.log"
    turn = json.dumps({"type": "assistant", "message": {"id": "a"}}) + "\n"
    long = json.dumps({"type": "user", "pad": "x" * (transcript.LONG_LINE + 10)})
    log.write_text(long + "\n" + turn)  # a long line (a big tool result): read
    meter = transcript.Meter(out, "stdout.log")
    assert meter.poll().turns == 1
    with log.open("a") as f:
        f.write(json.dumps({"type": "assistant", "message": {"id": "b"}}))  # no newline yet
    assert meter.poll().turns == 1
    with log.open("a") as f:
        f.write("\n")
    assert meter.poll().turns == 2
    # the file is swapped: the meter fails closed, keeping what it had read
    log.unlink()
    log.write_text(turn + json.dumps({"type": "assistant", "message": {"id": "c"}}) + "\n")
    swapped = meter.poll()
    assert swapped.turns == 2 and swapped.tampered and swapped.over(10, None) == "agent.transcript"
    # a link is never followed
    linked = transcript.Meter(out, "stdout.log")
    assert linked.poll().turns == 2
    log.unlink()
    os.symlink("/etc/passwd", log)
    assert linked.poll().tampered is not None


# --- usage in the ledger ------------------------------------------------------------------------


def test_agent_usage_is_one_event_per_finished_attempt_and_cumulative(tmp_path: Path) -> None:
    led = Ledger.open(tmp_path / "ledger.jsonl")
    led.append("job.accepted", "job.accepted", {"contractDigest": "sha256:x", "limitSeconds": 60})
    usage = {"attempt": 1, "turns": 3, "costUsd": 0.5}
    led.append("a1", "attempt.starting", {"attempt": 1, "containerName": "c1"})
    with pytest.raises(LedgerCorrupt, match="has not finished"):
        led.append("u1", "agent.usage", usage)
    fin = {"attempt": 1, "seconds": 1.0, "classification": "cancelled"}
    led.append("f1", "attempt.finished", fin)
    led.append("u1", "agent.usage", usage)
    with pytest.raises(LedgerCorrupt, match="appears twice"):
        led.append("u1-again", "agent.usage", usage)
    with pytest.raises(LedgerCorrupt, match="does not have"):
        led.append("u2", "agent.usage", {**usage, "attempt": 2})
    led.append("a2", "attempt.starting", {"attempt": 2, "containerName": "c2"})
    led.append("f2", "attempt.finished", {**fin, "attempt": 2})
    led.append("u2", "agent.usage", {"attempt": 2, "turns": 4, "costUsd": 0.25})
    state = Ledger.open(tmp_path / "ledger.jsonl").state
    assert (state.agent_turns, state.agent_cost) == (7, 0.75)


# --- secrets ----------------------------------------------------------------------------------


def test_secrets_are_read_from_a_file_or_the_environment(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-file-value\n")
    adapter = AgentAdapter.model_validate(
        {
            **SCRIPTED,
            "secrets": [
                {"env": "A", "file": str(key)},
                {"env": "B", "fromEnv": "RUNNER_TEST_AGENT_KEY"},
            ],
        }
    )
    got = agents.secret_values(adapter, {"RUNNER_TEST_AGENT_KEY": "sk-env-value"})
    assert got == {"A": "sk-file-value", "B": "sk-env-value"}
    with pytest.raises(HostConfigError) as missing:
        agents.secret_values(adapter, {})
    assert "RUNNER_TEST_AGENT_KEY" in str(missing.value)
    key.write_text("")
    with pytest.raises(HostConfigError, match="empty") as empty:
        agents.secret_values(adapter, {"RUNNER_TEST_AGENT_KEY": "sk-env-value"})
    assert "sk-env-value" not in str(empty.value)


def test_redact_scrubs_a_value_across_chunks_and_follows_no_link(tmp_path: Path) -> None:
    secret = "sk-redact-me-0123456789"  # noqa: S105 - made up for the test
    log = tmp_path / "stdout.log"
    head = b"a" * (1024 * 1024 - 5)  # the value straddles the 1 MiB read boundary
    log.write_bytes(head + secret.encode() + b"\nmore " + secret.encode())
    os.symlink(log, tmp_path / "link.log")
    (tmp_path / "clean.log").write_text("nothing here")
    redactor = Redactor({"K": secret})
    changed = redactor.files(tmp_path, ["stdout.log", "link.log", "clean.log"])
    assert changed == ["stdout.log"]
    data = log.read_bytes()
    assert secret.encode() not in data
    assert data == head + b"[redacted: K]\nmore [redacted: K]"


def test_the_manuals_adapter_example_is_a_valid_policy() -> None:
    text = (ROOT / "docs" / "how-to" / "agent-runs.md").read_text()
    start = text.index('{"agents": {\n  "claude-code"')
    block = text[start : text.index("```", start)]
    data = json.loads(
        block.replace("sha256:<id of runner-agent-claude:local>", "sha256:" + "e" * 64)
    )
    adapter = HostPolicy.model_validate(data).agents["claude-code"]
    assert adapter.secrets[0].env == "ANTHROPIC_API_KEY" and adapter.usage == "claude-code"


# --- the orchestrator's decisions, with the fake backend -----------------------------------


def _turns(mounts: dict[str, Path], first: int, count: int, result: bool = False) -> None:
    out = mounts["/job/output"] / "logs"
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        {"type": "assistant", "message": {"id": f"m{first + i}", "content": []}}
        for i in range(count)
    ]
    if result:
        lines.append({"type": "result", "subtype": "success", "num_turns": count})
        (out / "evaluation.log").write_text('{"accuracy": 0.819}\n')
    with (out / "stdout.log").open("a") as f:
        f.writelines(json.dumps(x) + "\n" for x in lines)


def test_an_attempt_that_vanished_counts_its_transcript_and_the_next_gets_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner dies while the agent runs and its container is removed meanwhile: the next
    run records the lost attempt's turns from its transcript, gives attempt 2 what is left,
    and hands the secret to the engine only."""
    monkeypatch.setenv("RUNNER_TEST_AGENT_KEY", "sk-fake-engine-only-0123456789")
    fake = FakeBackend()
    info = fake.add_image()
    specs: list[ContainerSpec] = []

    def jobs(spec: ContainerSpec) -> FakeJob:
        specs.append(spec)
        if len(specs) == 1:
            return FakeJob(seconds=float("inf"), work=lambda m: _turns(m, 0, 3))
        return FakeJob(work=lambda m: _turns(m, 10, 2, result=True))

    fake.jobs = jobs
    contract = _contract(tmp_path, lambda d: d["agent"].update(maxTurns=10))
    options = scripted_options(tmp_path, info.id)
    with pytest.raises(Crash):
        orchestrator.run(contract, options, backend=fake, progress=CrashingProgress(fake))
    fake.frozen = False
    fake.containers.clear()  # someone removed it
    env = orchestrator.as_json(orchestrator.run(contract, options, backend=fake))
    assert env["status"] == "succeeded", env["failure"]
    usage = env["agentUsage"]
    assert [(a["attempt"], a["turns"]) for a in usage["attempts"]] == [(1, 3), (2, 2)]
    assert usage["turns"] == 5
    assert specs[1].command[specs[1].command.index("--max-turns") + 1] == "7"
    assert specs[0].environment["API_KEY"] == "sk-fake-engine-only-0123456789"
    assert files_holding(Path(env["jobDir"]), b"sk-fake-engine-only") == []


class _CtrlC(FakeBackend):
    """Ctrl-C once the engine started the container: in the start call's answer ("start"),
    or at the watch's third wait ("watch")."""

    def __init__(self, at: str) -> None:
        super().__init__()
        self.at, self.waits = at, 0

    def start(self, container_id: str) -> None:
        super().start(container_id)
        if self.at == "start":
            raise KeyboardInterrupt

    def wait(self, container_id: str, timeout: float) -> int | None:
        self.waits += 1
        if self.at == "watch" and self.waits == 3:
            raise KeyboardInterrupt
        return super().wait(container_id, timeout)


@pytest.mark.parametrize("at", ["watch", "start"])
def test_an_agent_cancelled_once_started_has_its_turns_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: str
) -> None:
    """A Ctrl-C while the engine's start answers is a cancel of a container that ran, as one
    during the watch: the agent's turns in it are counted, so the next attempt does not get
    them again (the guard follows its output before the stop)."""
    monkeypatch.setenv("RUNNER_TEST_AGENT_KEY", "sk-fake-engine-only-0123456789")
    fake = _CtrlC(at)
    info = fake.add_image()
    fake.jobs = FakeJob(seconds=float("inf"), work=lambda m: _turns(m, 0, 3))
    contract = _contract(tmp_path, lambda d: d["agent"].update(maxTurns=10))
    options = scripted_options(tmp_path, info.id)
    env = orchestrator.as_json(orchestrator.run(contract, options, backend=fake))
    assert env["failure"]["category"] == "cancelled"
    assert env["container"] is not None and env["container"]["stoppedByRunner"] is True
    usage = env["agentUsage"]
    assert [(a["attempt"], a["turns"]) for a in usage["attempts"]] == [(1, 3)]


def test_hostile_numbers_in_a_transcript_are_not_believed() -> None:
    """Infinite or absurd costs and token counts (a float overflow, a 400-digit integer) are
    skipped, never stored: the ledger and the envelope stay finite JSON."""
    reader = transcript.Reader(transcript.Prices(input=1.0))
    reader.line(b'{"type": "result", "num_turns": true, "total_cost_usd": Infinity}')
    reader.line(b'{"type": "result", "num_turns": -3, "total_cost_usd": NaN}')
    reader.line(
        b'{"type": "assistant", "message": {"id": "a", "usage": {"input_tokens": 1'
        + b"0" * 400
        + b"}}}"
    )
    reader.line(b'{"type": "assistant", "message": {"id": "b", "usage": {"input_tokens": 1e999}}}')
    reader.line(b"[" * 100_000)
    usage = reader.usage()
    assert (usage.turns, usage.costUsd, usage.reportedTurns, usage.reportedCostUsd) == (
        2,
        0,
        None,
        None,
    )
