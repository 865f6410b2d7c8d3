"""The plan's pure rules for what reaches the engine (no engine here): limits rounded down and
never 0, and required command fragments matched against argv elements."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.backends.types import Limits
from runner.contract import load_contract, with_digest
from runner.core.errors import PolicyViolation, ProtocolAmbiguous
from runner.planning import plan, policy
from tests.support import FAKE_IMAGE_ID, toy_data


def _toy() -> dict[str, Any]:
    data = toy_data()
    data["environment"]["image"] = FAKE_IMAGE_ID
    return data


POLICY = policy.HostPolicy(acceptUnsigned=True).resolved()


def _plan(tmp_path: Path, overrides: dict[str, float] | None = None, **env: Any) -> Limits:
    data = _toy()
    data["environment"].update(env)
    path = tmp_path / "task.json"
    path.write_text(json.dumps(with_digest(data)))
    built = plan.build(
        load_contract(path), POLICY, job_id="j", host_uid=0, host_gid=0, overrides=overrides
    )
    return built.limits


def test_limits_are_rounded_down_to_engine_units(tmp_path: Path) -> None:
    lim = _plan(tmp_path, cpus=0.0123456789, memoryGb=0.1, shmGb=0.001, tmpfsMb=3)
    assert lim.cpus == 0.012345678  # whole nanoCPUs, rounded down
    assert lim.memory_bytes == lim.memory_swap_bytes == int(0.1 * 1024**3)
    assert lim.shm_bytes == int(0.001 * 1024**3)
    assert lim.tmpfs_bytes == 3 * 1024**2
    assert _plan(tmp_path, {"pidsLimit": 20.9}).pids == 20


@pytest.mark.parametrize(
    ("env", "overrides", "where"),
    [
        ({"cpus": 0.009}, {}, "$.environment.cpus"),
        ({"memoryGb": 0.015}, {}, "$.environment.memoryGb"),
        ({"shmGb": 0}, {}, "$.environment.shmGb"),
        ({"diskGb": 0.0000001}, {}, "$.environment.diskGb"),
        ({"logLimitMb": 0.0009}, {}, "$.environment.logLimitMb"),
        ({"timeoutMinutes": 0.01}, {}, "$.environment.timeoutMinutes"),
        ({}, {"pidsLimit": 15.9}, "--limit pidsLimit"),
        ({}, {"tmpfsMb": 0.999}, "--limit tmpfsMb"),
        ({}, {"cpus": 1e-12}, "--limit cpus"),
    ],
)
def test_limits_below_their_minimum_are_refused(
    tmp_path: Path, env: dict[str, Any], overrides: dict[str, float], where: str
) -> None:
    with pytest.raises(PolicyViolation, match="no cap at all") as info:
        _plan(tmp_path, overrides, **env)
    assert info.value.message.startswith(where)


def test_limits_never_hold_a_zero() -> None:
    """The seam type refuses a 0 cap even if a caller skipped the plan."""
    good: dict[str, Any] = {
        "cpus": 1.0,
        "memory_bytes": 1 << 30,
        "memory_swap_bytes": 1 << 30,
        "shm_bytes": 1 << 20,
        "pids": 64,
        "tmpfs_bytes": 1 << 20,
        "gpus": "none",
        "network": "none",
        "timeout_seconds": 60.0,
    }
    Limits(**good)
    for key in ("cpus", "memory_bytes", "shm_bytes", "tmpfs_bytes", "timeout_seconds", "pids"):
        with pytest.raises(ValueError, match=f"Limits.{key.split('_')[0]}"):
            Limits(**{**good, key: 0})


def _command(tmp_path: Path, argv: list[str], fragments: list[str]) -> tuple[str, ...]:
    data = _toy()
    data["protocol"].update(command=argv, requiredCommandFragments=fragments)
    path = tmp_path / "task.json"
    path.write_text(json.dumps(with_digest(data)))
    return plan.check_command(load_contract(path))


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["python3", "/job/input/repository/evaluate.py", "--checkpoint", "c"], ["evaluate.py"]),
        (["python3", "evaluate.py", "--checkpoint=c.json"], ["evaluate.py", "--checkpoint"]),
        (["python3", "evaluate.py", "--split", "test"], ["evaluate.py --split test"]),
        (["sh", "-c", "python3 evaluate.py --x"], ["python3 evaluate.py --x"]),
    ],
)
def test_fragments_match_argv_elements(
    tmp_path: Path, argv: list[str], fragments: list[str]
) -> None:
    assert _command(tmp_path, argv, fragments) == tuple(argv)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["sh", "-c", "python3 evaluate.py # --checkpoint"], "--checkpoint"),
        (["sh", "-c", "echo evaluate.py"], "evaluate.py"),
        (["python3", "my-evaluate.py"], "evaluate.py"),
        (["python3", "evaluate.py", "--split", "train", "test"], "--split test"),
        (["python3", "evaluate.py", "--checkpointer"], "--checkpoint"),
    ],
)
def test_fragments_inside_other_text_do_not_count(
    tmp_path: Path, argv: list[str], fragment: str
) -> None:
    with pytest.raises(ProtocolAmbiguous, match=f"lacks the required fragment.*{fragment}"):
        _command(tmp_path, argv, [fragment])
