#!/usr/bin/env python3
"""The runner's scripted agent runtime: an agent without a model, for runs without an API key.

It does what an agent of an agent_planned contract does, from a script instead of a model:
reads ``/job/input/task.json`` and its prompt, runs the commands its prompt lists (each one
"turn", reported as a Bash tool call), runs the preflight checks the contract declares, writes
the preflight evidence and ``/job/output/result.json`` in the execute-contract shape, and
prints its transcript on stdout as Claude Code's ``--output-format stream-json`` does
(``system`` init, ``assistant`` messages with their ``tool_use`` and ``usage``, ``user``
tool results, a final ``result`` with ``num_turns`` and ``total_cost_usd``), so that the runner
reads its usage exactly as it reads Claude Code's.

    agent.py --prompt FILE [--max-turns N] [--max-budget-usd USD] [--model NAME]

The prompt's lines it acts on (anything else is prose for people):

    preflight <check id>: <shell command>   a contract preflight check; exit 0 passes it
    run: <shell command>                    a command of the work, in order
    cost-per-turn: <USD>                    what each turn costs (default 0)
    tokens-per-turn: <input> <output>       the usage each turn reports (default 100 20)
    repeat: <shell command>                 after the work, run this for ever (a runaway)
    pause: <seconds>                        wait between turns (default 0)
    ignore-limits: yes                      do not stop at --max-turns / --max-budget-usd

It stops itself at its limits as Claude Code does (``error_max_turns`` before a turn past
``--max-turns``, ``error_max_budget_usd`` once the cost reaches ``--max-budget-usd``) unless
told to ignore them, which is how the runner's own enforcement is tested.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TASK = Path("/job/input/task.json")
OUTPUT = Path("/job/output")
WORKSPACE = Path("/job/workspace")
TAIL = 4000


class Stop(Exception):
    def __init__(self, subtype: str, message: str) -> None:
        super().__init__(message)
        self.subtype = subtype


class Agent:
    def __init__(self, args: argparse.Namespace, script: dict[str, Any]) -> None:
        self.args = args
        self.script = script
        self.turns = 0
        self.cost = 0.0
        self.tokens = [0, 0]
        self.ignore = script["ignore_limits"]

    def emit(self, event: dict[str, Any]) -> None:
        print(json.dumps(event), flush=True)

    def _turn(self, content: list[dict[str, Any]]) -> None:
        """One model turn: checked against the limits, then reported with its usage."""
        limit = self.args.max_turns
        if not self.ignore and limit is not None and self.turns + 1 > limit:
            raise Stop("error_max_turns", f"Reached maximum number of turns ({limit})")
        self.turns += 1
        inp, out = self.script["tokens"]
        self.tokens[0] += inp
        self.tokens[1] += out
        self.cost += self.script["cost_per_turn"]
        self.emit(
            {
                "type": "assistant",
                "message": {
                    "id": f"msg_scripted_{self.turns}",
                    "type": "message",
                    "role": "assistant",
                    "model": self.args.model or "scripted",
                    "content": content,
                    "usage": {"input_tokens": inp, "output_tokens": out},
                },
                "parent_tool_use_id": None,
            }
        )
        budget = self.args.max_budget_usd
        if not self.ignore and budget is not None and self.cost >= budget:
            raise Stop("error_max_budget_usd", f"Reached maximum budget (${budget:g})")
        if self.script["pause"]:
            time.sleep(self.script["pause"])

    def bash(self, command: str, why: str) -> int:
        """A Bash tool call: the command runs in /job/workspace; its output is the result."""
        tool_id = f"toolu_scripted_{self.turns + 1}"
        self._turn(
            [
                {"type": "text", "text": why},
                {"type": "tool_use", "id": tool_id, "name": "Bash", "input": {"command": command}},
            ]
        )
        done = subprocess.run(
            ["/bin/sh", "-c", command],
            cwd=WORKSPACE,
            capture_output=True,
            text=True,
            errors="replace",
            check=False,
        )
        text = (done.stdout + done.stderr)[-TAIL:]
        self.emit(
            {
                "type": "user",
                "message": {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": tool_id,
                            "content": text or f"(exit {done.returncode})",
                            "is_error": done.returncode != 0,
                        }
                    ],
                },
                "parent_tool_use_id": None,
            }
        )
        return done.returncode

    def write(self, path: Path, data: Any, why: str) -> None:
        """A Write tool call: a JSON file under /job/output."""
        text = json.dumps(data, indent=2) + "\n"
        tool_id = f"toolu_scripted_{self.turns + 1}"
        self._turn(
            [
                {"type": "text", "text": why},
                {
                    "type": "tool_use",
                    "id": tool_id,
                    "name": "Write",
                    "input": {"file_path": str(path), "content": text},
                },
            ]
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        self.emit(
            {
                "type": "user",
                "message": {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": "ok"}],
                },
                "parent_tool_use_id": None,
            }
        )

    def result(self, subtype: str, text: str) -> None:
        self.emit(
            {
                "type": "result",
                "subtype": subtype,
                "is_error": subtype != "success",
                "num_turns": self.turns,
                "total_cost_usd": round(self.cost, 6),
                "usage": {"input_tokens": self.tokens[0], "output_tokens": self.tokens[1]},
                "result": text,
            }
        )


def read_script(prompt: str) -> dict[str, Any]:
    script: dict[str, Any] = {
        "preflight": {},
        "run": [],
        "repeat": None,
        "cost_per_turn": 0.0,
        "tokens": (100, 20),
        "pause": 0.0,
        "ignore_limits": False,
    }
    for raw in prompt.splitlines():
        line = raw.strip()
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key.startswith("preflight ") and value:
            script["preflight"][key.removeprefix("preflight ").strip()] = value
        elif key == "run" and value:
            script["run"].append(value)
        elif key == "repeat" and value:
            script["repeat"] = value
        elif key == "cost-per-turn":
            script["cost_per_turn"] = float(value)
        elif key == "tokens-per-turn":
            inp, out = value.split()
            script["tokens"] = (int(inp), int(out))
        elif key == "pause":
            script["pause"] = float(value)
        elif key == "ignore-limits":
            script["ignore_limits"] = value.lower() in {"yes", "true", "1"}
    return script


def _fragment_ran(fragment: str, commands: list[str]) -> bool:
    """Whether a required fragment's words are consecutive words of a command that ran (a
    path may end in a word; an option may carry its value with '=')."""
    try:
        words = shlex.split(fragment) or [fragment]
    except ValueError:
        words = [fragment]
    for command in commands:
        try:
            argv = shlex.split(command)
        except ValueError:
            continue
        for i in range(len(argv) - len(words) + 1):
            if all(
                e == w or e.endswith("/" + w) or e.startswith(w + "=")
                for w, e in zip(words, argv[i : i + len(words)], strict=True)
            ):
                return True
    return False


def work(agent: Agent, task: dict[str, Any]) -> dict[str, Any]:
    """Preflight, the commands, then result.json: the execute-contract result."""
    protocol = task.get("protocol") or {}
    preflight = protocol.get("preflight") or {}
    checks = [c.get("id") or c.get("checkId") for c in preflight.get("checks") or []]
    outcomes: dict[str, str] = {}
    for check in [c for c in checks if c]:
        command = agent.script["preflight"].get(check)
        if command is None:
            outcomes[check] = "not_run"
            continue
        code = agent.bash(command, f"Preflight check {check}.")
        outcomes[check] = "passed" if code == 0 else "failed"
    problems = [f"preflight check {c} {s}" for c, s in outcomes.items() if s != "passed"]
    evidence_paths = []
    if preflight.get("evidencePath"):
        agent.write(OUTPUT / preflight["evidencePath"], outcomes, "Preflight evidence.")
        evidence_paths.append(preflight["evidencePath"])
    ran: list[str] = []
    if not problems:
        for command in agent.script["run"]:
            code = agent.bash(command, "Run the work.")
            ran.append(command)
            if code != 0:
                problems.append(f"`{command}` exited {code}")
                break
    for fragment in protocol.get("requiredCommandFragments") or []:
        if ran and not problems and not _fragment_ran(fragment, ran):
            problems.append(f"no command that ran contains the required fragment {fragment!r}")
    parser_inputs = []
    for m in task.get("measurements") or []:
        path = (m.get("parser") or {}).get("evidencePath")
        if path and (OUTPUT / path).is_file():
            parser_inputs.append(path)
        elif path and not problems:
            problems.append(f"the parser input {path} was not produced")
    for path in parser_inputs:
        if path not in evidence_paths:
            evidence_paths.insert(0, path)
    succeeded = not problems
    groups = (protocol.get("workload") or {}).get("groups") or []
    result: dict[str, Any] = {
        "schemaVersion": "2.0",
        "status": "completed" if succeeded else "failed",
        "summary": "The scripted agent ran the commands of its prompt."
        if succeeded
        else "The scripted agent could not complete the work: " + "; ".join(problems),
        "execution": {
            "status": "succeeded" if succeeded else "failed",
            "failure": None
            if succeeded
            else {
                "category": "nonzero_exit",
                "stage": "execution",
                "retryable": False,
                "reason": "; ".join(problems),
            },
        },
        "evidence": [{"path": p} for p in evidence_paths],
        "experiment": {"commands": ran},
        "workloadCompletion": [
            {
                "groupId": g.get("groupId") or g.get("id"),
                "units": g.get("units") or 1,
                "evidencePath": parser_inputs[0],
            }
            for g in groups
            if parser_inputs and succeeded
        ],
        "diagnosis": "A scripted run: the commands came from the prompt, not a model. "
        + ("Every command exited 0." if succeeded else "; ".join(problems)),
    }
    if preflight:
        result["preflight"] = {
            "source": "agent",
            "evidencePath": preflight.get("evidencePath"),
            "checks": [{"id": c, "status": s} for c, s in outcomes.items()],
        }
    agent.write(OUTPUT / "result.json", result, "Write result.json.")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description="The runner's scripted agent runtime.")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-turns", type=int, default=None)
    parser.add_argument("--max-budget-usd", type=float, default=None)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    prompt = Path(args.prompt).read_text()
    task = json.loads(TASK.read_text())
    agent = Agent(args, read_script(prompt))
    agent.emit(
        {
            "type": "system",
            "subtype": "init",
            "runtime": "runner-scripted-agent",
            "model": args.model or "scripted",
            "tools": ["Bash", "Write"],
            "maxTurns": args.max_turns,
            "maxBudgetUsd": args.max_budget_usd,
            "prompt": args.prompt,
            "cwd": os.getcwd(),
        }
    )
    try:
        result = work(agent, task)
        repeat = agent.script["repeat"]
        while repeat is not None:
            agent.bash(repeat, "One more look.")
        agent._turn([{"type": "text", "text": result["summary"]}])
    except Stop as stop:
        agent.result(stop.subtype, str(stop))
        return 1
    agent.result("success", result["summary"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
