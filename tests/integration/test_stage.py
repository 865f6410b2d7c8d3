"""`runner stage CONTRACT`: the job folder laid out as `runner run` lays it out before it
creates a container, with no engine at all (DOCKER_HOST points nowhere), inputs checked
against the digests the contract binds, hostile inputs refused, and then `runner run` on the
same job folder runs the staged job (the real engine).

The tests that need no engine are in tests/unit/test_stage.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import (
    run_job,
)
from tests.unit.test_stage import (  # noqa: F401  (shared with the pure half; fixtures among them)
    NO_ENGINE,
    bound_contract,
    ledger_events,
    stage,
)


@pytest.mark.docker
def test_runner_run_runs_the_staged_job(tmp_path: Path, image_id: str) -> None:
    """Staged with no engine, then `runner run` on the same contract and state folder runs
    it (the real engine): succeeded, attempt 1, the ledger accepted it once; staging it
    again after it finished is refused."""
    contract = bound_contract(tmp_path, image_id)
    code, info, err = stage(contract, tmp_path / "state")
    assert code == 0, err
    code, envelope, err = run_job(contract, tmp_path / "state")
    assert code == 0, err
    assert envelope["status"] == "succeeded" and envelope["jobDir"] == info["jobDir"]
    assert [m["value"] for m in envelope["measurements"]] == [0.819]
    events = ledger_events(Path(info["jobDir"]))
    assert events.count("job.accepted") == 1 and events[-1] == "job.finished"
    assert envelope["budget"]["attempts"] == 1
    code, refused, _ = stage(contract, tmp_path / "state")
    assert code == 3 and "already finished" in refused["error"]
