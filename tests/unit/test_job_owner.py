"""``record/owner.json``: who holds a job's lock, as a Slurm batch step and the Epilog ask it
(:meth:`runner.state.jobdir.JobDir.owner_pid`). Real locks and /proc; no engine."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runner.core import hostid
from runner.state.jobdir import JobDir


def _job(tmp_path: Path) -> JobDir:
    job = JobDir(tmp_path / "job")
    job.record.mkdir(parents=True)
    return job


def test_the_holder_is_named_while_it_holds_the_lock(tmp_path: Path) -> None:
    job = _job(tmp_path)
    assert job.owner_pid() is None, "no lock: no owner"
    with job.locked():
        assert job.owner_pid() == os.getpid()
        data = json.loads(job.owner.read_text())
        assert data["host"] == hostid.identity() and data["startTicks"] > 0
    assert job.owner_pid() is None, "released: no owner, though owner.json is still there"


@pytest.mark.hostile
def test_an_owner_record_that_does_not_match_the_process_names_no_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pid used again (another start time), another host or boot, a record that is a link,
    too large or not JSON: none is taken for the owner (nothing is signalled on its word)."""
    job = _job(tmp_path)
    with job.locked():
        good = json.loads(job.owner.read_text())
        for bad in (
            {**good, "startTicks": good["startTicks"] + 1},
            {**good, "pid": 1},
            {**good, "pid": True},
            {**good, "host": {**good["host"], "bootId": "another-boot"}},
            {**good, "host": {**good["host"], "name": "node-b"}},
            [good],
        ):
            job.owner.write_text(json.dumps(bad))
            assert job.owner_pid() is None, bad
        job.owner.write_text("{" + " " * 5000 + "}")
        assert job.owner_pid() is None, "larger than its cap"
        job.owner.unlink()
        elsewhere = tmp_path / "elsewhere.json"
        elsewhere.write_text(json.dumps(good))
        job.owner.symlink_to(elsewhere)
        assert job.owner_pid() is None, "a link is never followed"
        job.owner.unlink()
        job.owner.write_text(json.dumps(good))
        assert job.owner_pid() == os.getpid()
        monkeypatch.setattr(hostid, "name", lambda: "node-b")
        assert job.owner_pid() is None, "recorded on another host than this one"
