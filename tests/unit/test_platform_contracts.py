"""The platform's contracts as they are issued: the seed's vocabulary, the execution mode, the
/job layout the job expects, and every attempt's evidence kept (issue 14).

The tests that need the engine are in tests/integration/test_platform_contracts.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.contract import load_contract, with_digest
from runner.contract.load import Trust
from runner.core.errors import ContractError
from tests.support import (
    SEED,
    TOY,
    run_cli,
    run_job,
)

EXAMPLE = TOY.parent / "agent-evaluation" / "task.json"


def every_seed_field(data: dict[str, Any]) -> None:
    """Every field the seed's contracts and prompts name, filled in."""
    data["protocol"].update(
        executionMode="fixed_entrypoint",
        objective="Evaluate the released checkpoint on the full label set.",
        preflight={
            "evidencePath": "preflight.json",
            "checks": [{"id": "runtime", "successCriteria": "python3 imports json"}],
        },
        workload={"groups": [{"groupId": "eval", "units": 1, "description": "one pass"}]},
        benchmark={"device": "cpu", "batchSize": 1, "dtype": "float32", "warmup": 0},
        referenceHardware={"cpu": "any"},
    )
    m = data["measurements"][0]
    m["dimensions"] = {"dataset": "toy", "split": "test", "samples": 1000, "repetitions": 1}
    m["aggregation"] = {"rule": "single"}
    m["description"] = "Top-1 accuracy of the released checkpoint."
    data["repository"]["implementationOrigin"] = "official"
    data["paper"]["markdownPath"] = "paper.md"
    data["paper"]["sourceMapPath"] = "paper.map.json"
    data["campaign"] = {
        "members": [{"experimentId": "toy-checkpoint-evaluation"}],
        "measurementMap": {"toy-accuracy": "toy-checkpoint-evaluation/toy-accuracy"},
        "workloads": [{"id": "eval", "experimentIds": ["toy-checkpoint-evaluation"]}],
    }
    data["workspacePlan"] = {"measurements": [{"measurementId": "toy-accuracy"}]}
    data["researchGraph"] = {"objects": [{"id": "ckpt"}], "steps": [{"id": "evaluate"}]}
    data["researchGoal"] = "Does the released checkpoint reach the reported accuracy?"
    data["reproductionScope"] = {"preset": "default"}
    data["reproductionGuide"] = "Run evaluate.py on checkpoint.json."
    data["scientificPlanningPolicy"] = {"compilationBoundary": "inventory only"}
    data["assets"] = [{"id": "labels", "acquisition": {"requiredPaths": ["labels.txt"]}}]


def _contract(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "task.json"
    path.write_text(json.dumps(with_digest(data), indent=2))
    return path


def test_the_seed_contract_verbatim_verifies_and_is_refused_without_its_agent_runtime(
    tmp_path: Path,
) -> None:
    """agent_planned: refused on a host whose policy has no adapter for its runtime, naming
    the field and what the host offers, before a job folder exists."""
    loaded = load_contract(SEED, Trust())
    assert loaded.digest == json.loads(SEED.read_text())["contractDigest"]
    assert loaded.model.execution_mode == "agent_planned"
    proc = run_cli(
        "verify", str(SEED), "--allow-unsigned", "--allow-network", "--allow-unpinned-image"
    )
    assert proc.returncode == 3, proc.stderr
    assert "policy_violation" in proc.stderr
    assert "$.agent.runtime" in proc.stderr and "'claude-code'" in proc.stderr
    assert "offers none" in proc.stderr
    code, envelope, _ = run_job(SEED, tmp_path / "state", "--allow-network")
    assert code == 3
    assert envelope["failure"]["category"] == "policy_violation"
    assert envelope["failure"]["stage"] == "policy"
    assert not (tmp_path / "state" / "jobs").exists()  # refused before a job folder exists


def test_an_explicit_agent_planned_contract_without_an_agent_is_ambiguous(
    tmp_path: Path,
) -> None:
    """executionMode agent_planned with a command and no agent: the command is not run."""
    data = json.loads((TOY / "task.json").read_text())
    data["protocol"]["executionMode"] = "agent_planned"
    data.pop("agent", None)
    proc = run_cli("verify", str(_contract(tmp_path, data)), "--allow-unsigned")
    assert proc.returncode == 3
    assert "protocol_ambiguous" in proc.stderr and "$.agent.runtime" in proc.stderr


def test_every_seed_field_is_accepted_and_unknown_ones_still_refused(tmp_path: Path) -> None:
    data = json.loads((TOY / "task.json").read_text())
    every_seed_field(data)
    loaded = load_contract(_contract(tmp_path, data), Trust())
    assert loaded.model.protocol.preflight is not None
    assert [c.id for c in loaded.model.protocol.preflight.checks] == ["runtime"]
    assert loaded.model.execution_mode == "fixed_entrypoint"
    for where, key in ((data["protocol"], "executionModes"), (data, "campaigns")):
        where[key] = "x"
        with pytest.raises(ContractError) as caught:
            load_contract(_contract(tmp_path, data), Trust())
        assert key in str(caught.value) and "$." in str(caught.value)
        del where[key]
    data["protocol"]["executionMode"] = "improvised"
    with pytest.raises(ContractError, match="executionMode"):
        load_contract(_contract(tmp_path, data), Trust())


def test_the_agent_planned_example_verifies_and_needs_a_host_with_its_runtime() -> None:
    loaded = load_contract(EXAMPLE, Trust())
    assert loaded.model.execution_mode == "agent_planned"
    proc = run_cli("verify", str(EXAMPLE), "--allow-unsigned")
    assert proc.returncode == 3 and "policy_violation" in proc.stderr
    assert "$.agent.runtime" in proc.stderr
