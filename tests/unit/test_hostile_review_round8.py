"""The eighth hostile review (replay, report, resource accounting, Slurm's served owner,
Kubernetes' budget): what it found, kept closed. No engine: job folders are made by the fake
backend and then changed as a hostile hand could."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

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


def test_a_job_folders_signed_statements_are_read_under_a_cap(
    tmp_path: Path, fake: FakeBackend
) -> None:
    """`runner report JOB` and `runner verify result JOB` read result.envelope.intoto.json
    (and verify result also result.json) whole (Path.read_bytes after is_file): a crafted job
    folder with a sparse 16 GiB file there (no disk used) took 16 GiB of memory (MemoryError
    under a 1.5 GiB address-space limit; without one, what the host has). They are read under
    the envelope's cap now (a FIFO or device refused unopened), and the result does not
    verify."""
    import subprocess
    import sys

    job = _job(tmp_path, fake)
    with (job / "result.envelope.intoto.json").open("r+b") as f:
        f.truncate(16 * 1024**3)
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 * 2**29, 3 * 2**29))\n"
        "from pathlib import Path\n"
        "from runner.cli._common import own_runner_keys\n"
        "from runner.results import report\n"
        "data = report.from_job(Path(sys.argv[1]), own_runner_keys())\n"
        "assert not data.verification.valid, data.verification\n"
        "print(data.verification.summary)\n"
        "from runner.core.errors import SignatureInvalid\n"
        "from runner.results import attest\n"
        "with open(Path(sys.argv[1]) / 'result.json', 'r+b') as f:\n"
        "    f.truncate(16 * 1024**3)\n"
        "try:\n"
        "    attest.verify_result(Path(sys.argv[1]), own_runner_keys())\n"
        "except SignatureInvalid as exc:\n"
        "    print(exc.message)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(job)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("larger than") == 2, proc.stdout


def test_a_replays_original_ledger_is_read_under_a_cap(tmp_path: Path, virtual_clock: Any) -> None:
    """`runner replay FOLDER` read the folder's record/ledger.jsonl whole (is_file, then
    read_bytes): a crafted folder with a sparse 16 GiB ledger took 16 GiB of memory
    (MemoryError under a 1.5 GiB address-space limit), and a link there was followed. It is
    read as the rest of the folder now: a regular file, no link followed, capped; over the cap
    the replay is refused."""
    import subprocess
    import sys

    from runner.backends.fake import FakeBackend, FakeJob
    from tests.unit.test_replay import _original, _writer

    fake = FakeBackend(jobs=FakeJob(work=_writer(lambda: '{"accuracy": 0.819}\n')))
    root, options = _original(tmp_path, fake)
    with (root / "record" / "ledger.jsonl").open("r+b") as f:
        f.truncate(16 * 1024**3)
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 * 2**29, 3 * 2**29))\n"
        "from pathlib import Path\n"
        "from runner.app import replay\n"
        "from runner.contract import Trust\n"
        "from runner.core.errors import RefusedError\n"
        "from runner.execution.options import RunOptions\n"
        "from runner.planning import policy\n"
        "pol = policy.LoadedPolicy(policy.HostPolicy(acceptUnsigned=True).resolved(), 't')\n"
        "opts = RunOptions(state_dir=Path(sys.argv[2]), policy=pol, trust=Trust(keys=[]))\n"
        "try:\n"
        "    replay.original(Path(sys.argv[1]), opts)\n"
        "except RefusedError as exc:\n"
        "    print('refused:', exc.message)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(root), str(options.state_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("refused:"), proc.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="takes another user's uid (root only)")
def test_another_local_user_cannot_hold_a_jobs_lock() -> None:
    """record/lock was made 0666 less the umask (0644): any local user could open it read-only
    and flock it (flock needs no write access), and hold it for as long as they liked: every
    runner of the job refused (JobBusy), and the Slurm Epilog's `runner cleanup --orphans`
    reading the lock as held by a runner owner.json does not name ("a runner is watching it")
    left a killed runner's container running. The job's lock is now its owner's alone (0600,
    made so when found otherwise)."""
    import fcntl
    import tempfile

    from runner.core.errors import JobBusy
    from runner.execution.sweeper import runner_alive
    from runner.state.jobdir import JobDir

    top = Path(tempfile.mkdtemp())
    try:
        top.chmod(0o755)  # a state folder other users may pass through, as a home's often is
        job = JobDir(top / "jobs" / "j")
        job.record.mkdir(parents=True)
        job.record.chmod(0o755)
        with job.locked():
            pass
        ready_r, ready_w = os.pipe()
        done_r, done_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the other user: nobody
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                fd = os.open(job.lock, os.O_RDONLY | os.O_NOFOLLOW)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                code = 0
            except OSError:
                code = 3
            finally:
                os.write(ready_w, bytes([code]))
                os.read(done_r, 1)
                os._exit(code)
        try:
            got = os.read(ready_r, 1)[0]
            held = runner_alive(job.root)
            busy = False
            try:
                with job.locked():
                    pass
            except JobBusy:
                busy = True
        finally:
            os.write(done_w, b"x")
            os.waitpid(pid, 0)
        assert got == 3, "another user opened and locked the job's lock"
        assert not held and not busy
    finally:
        import shutil as _shutil

        _shutil.rmtree(top)


def test_the_reports_series_are_read_for_as_many_attempts_and_points_as_are_drawn(
    tmp_path: Path,
) -> None:
    """The page draws the series of at most ROWS_CAP attempts and 2,000 points of each, but
    every attempt the envelope names had its series read, validated and kept whole: an
    envelope of a thousand attempts naming one 4 MiB record (a few hundred thousand points)
    read it a thousand times and kept every point each time. Now only as many are read, and
    kept, as the page draws."""
    from runner.models.resources import AttemptResources, ResourceRecord, ResourceSeries
    from runner.results.report import gather
    from runner.results.report.markup import ROWS_CAP

    base: dict[str, object] = dict.fromkeys(AttemptResources.model_fields, None)
    base.update(engine="docker", runtime="runc", samples=1, gpus=[])
    points = 3000
    series = ResourceSeries(
        intervalSeconds=1.0,
        maxPoints=256,
        t=[float(i) for i in range(points)],
        cpuSeconds=[float(i) for i in range(points)],
        memoryBytes=[i for i in range(points)],
        ioReadBytes=[None] * points,
        ioWriteBytes=[None] * points,
        pids=[None] * points,
    )
    figures = AttemptResources.model_validate(base)
    record = ResourceRecord(attempt=1, figures=figures, series=series)
    folder = tmp_path / "record" / "attempts" / "1"
    folder.mkdir(parents=True)
    (folder / "resources.json").write_text(record.model_dump_json())
    res = {"samples": 1, "series": "record/attempts/1/resources.json"}
    env = {"attempts": [{"attempt": n, "resources": res} for n in range(1, 5 * ROWS_CAP + 1)]}
    shown = gather.resources_of(env, tmp_path)
    drawn = [s["series"] for s in shown if "series" in s]
    assert len(shown) == 5 * ROWS_CAP  # every attempt's figures are listed
    assert len(drawn) == ROWS_CAP, len(drawn)
    assert all(len(d) == gather.SERIES_POINTS_CAP for d in drawn)
