"""The eighth hostile review (replay, report, resource accounting, Slurm's served owner,
Kubernetes' budget): what it found, kept closed. No engine: job folders are made by the fake
backend and then changed as a hostile hand could."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from runner.backends.fake import FakeBackend
from runner.results import report
from tests.unit.test_orchestrator_fake import fake as fake
from tests.unit.test_report import _job, _own_keys

pytestmark = pytest.mark.hostile


def test_the_reports_ledger_is_read_without_following_a_link(
    tmp_path: Path, fake: FakeBackend
) -> None:
    """record/ledger.jsonl was lstat'ed (the link's own size checked) and then read through the
    link, whole: a link to /dev/zero took memory without end, one to a FIFO hung the command,
    one to a ledger elsewhere was read as the job's. The page now reads it as every other file
    of the run: a regular file reached without a link, under the cap."""
    job = _job(tmp_path, fake)
    ledger = job / "record" / "ledger.jsonl"
    assert report.from_job(job, _own_keys()).attempts[0]["startedAt"]  # its own is read
    elsewhere = tmp_path / "elsewhere.jsonl"
    shutil.copyfile(ledger, elsewhere)
    ledger.unlink()
    ledger.symlink_to(elsewhere)
    assert report.from_job(job, _own_keys()).attempts[0]["startedAt"] is None
    ledger.unlink()
    os.mkfifo(ledger)  # no writer: an open that blocks would hang here
    assert report.from_job(job, _own_keys()).attempts[0]["startedAt"] is None
