"""``runner serve``'s child when its client goes away (runner.app.server._watch_client): the
job runs on, except under Slurm before the child owns a job (its lock), where the job is
cancelled, since the batch step waits only for a runner that owns the job. A socket pair
stands for the client's connection; the signal and the redirection are recorded, not done."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from runner.app import server
from runner.state.jobdir import JobDir


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sent: list[int] = []
    monkeypatch.setattr(server.os, "kill", lambda pid, sig: sent.append(sig))
    monkeypatch.setattr(server.os, "dup2", lambda fd, target: None)
    return sent


def _client_goes(monkeypatch: pytest.MonkeyPatch, slurm: str | None) -> None:
    if slurm is None:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    else:
        monkeypatch.setenv("SLURM_JOB_ID", slurm)
    ours, theirs = socket.socketpair()
    theirs.close()
    server._watch_client(ours)
    ours.close()


def test_outside_slurm_a_client_that_goes_leaves_the_job_running(
    monkeypatch: pytest.MonkeyPatch, recorded: list[int]
) -> None:
    _client_goes(monkeypatch, None)
    assert recorded == []


def test_under_slurm_a_client_gone_before_the_job_is_owned_cancels_it(
    monkeypatch: pytest.MonkeyPatch, recorded: list[int]
) -> None:
    _client_goes(monkeypatch, "41")
    assert recorded == [server.signal.SIGTERM]


def test_under_slurm_a_client_gone_once_the_job_is_owned_leaves_it_running(
    monkeypatch: pytest.MonkeyPatch, recorded: list[int], tmp_path: Path
) -> None:
    job = JobDir(tmp_path / "job")
    job.record.mkdir(parents=True)
    with job.locked():
        _client_goes(monkeypatch, "41")
    assert recorded == [], "the batch step waits for this owner"
