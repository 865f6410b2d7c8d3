"""Hostile review, round 5: the refactor that gave locks, units, untrusted fields, the
submission store, the bundle checks and the CLI spellings each one owner (since 3434b0a).

Each test is a way a hostile job, agent, co-tenant, API server or client could use the new
code; each failed before its fix."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner import client
from runner.app import host
from runner.backends.podmancaps import PodmanHost
from runner.cli import dispatch
from runner.cli.serve import served_only
from runner.core import locks, units
from runner.execution.sweeper import runner_alive
from runner.scheduling.kubernetes import apply, render
from runner.state.jobdir import JobDir
from tests.support import run_cli
from tests.support.clock import VirtualClock

pytestmark = pytest.mark.hostile


# -- runner serve: only `run` and `verify contract` -------------------------------------------


def _refusing_dispatch(argv: list[str]) -> int:
    raise AssertionError(f"dispatched {argv}")


@pytest.mark.parametrize(
    "argv",
    [
        ["key", "new", "--out", "k"],
        ["job", "cleanup", "j"],
        ["verify", "bundle", "b.tar"],
        ["verify", "--log-level", "debug", "bundle", "b.tar"],  # dispatch drops the option
        ["verify", "--log-format=json", "ledger", "j"],
        ["--log-level", "debug", "key", "new", "--out", "k"],
        ["serve"],
        ["verify", "--help"],
        ["--version"],
        [],
    ],
)
def test_the_server_runs_no_other_command_a_client_sends(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The server forked a child that ran any command line a client sent (the check was the
    client's alone); a crafted client made it run `key new`, `job cleanup`, `verify bundle`."""
    assert served_only(_refusing_dispatch)(argv) == 2
    assert "only `runner run` and `runner verify contract`" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "t.json"],
        ["--log-level", "debug", "run", "t.json"],
        ["verify", "t.json"],
        ["verify", "contract", "t.json"],
        ["verify", "--log-level=debug", "contract", "t.json"],
        ["verify", "--json", "bundle"],  # `verify contract --json bundle`: a contract named so
    ],
)
def test_the_server_still_runs_run_and_verify_contract(argv: list[str]) -> None:
    seen: list[list[str]] = []
    assert served_only(lambda a: seen.append(a) or 7)(argv) == 7
    assert seen == [argv]


def test_a_client_does_not_hand_verify_bundle_to_the_server_behind_a_logging_option() -> None:
    """`runner verify --log-level debug bundle B` is `verify bundle` to dispatch, but the client
    looked only at the word after `verify` and handed it to the server."""
    assert not client.served(["verify", "--log-level", "debug", "bundle", "b.tar"])
    assert not client.served(["verify", "--log-format=json", "result", "j"])
    assert client.served(["verify", "--log-level", "debug", "t.json"])
    assert client.served(["run", "--log-level=debug", "t.json"])
    assert not client.served(["--log-level", "debug", "run", "t.json"])  # here, as before


def test_logging_options_are_read_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    named, rest = host.split_logging_options(["a", "--log-level=info", "b", "--", "--log-format"])
    assert named == {"--log-level": "info"} and rest == ["a", "b", "--", "--log-format"]
    monkeypatch.setenv("RUNNER_LOG_LEVEL", "debug")
    # A --log-level that names nothing still overrides the environment (as before).
    named, rest = host.split_logging_options(["x", "--log-level"])
    assert named == {"--log-level": None} and rest == ["x"]
    with pytest.raises(SystemExit) as exc:
        dispatch(["--log-level=", "gpu", "ls"])  # an empty value is still refused
    assert exc.value.code == 2


# -- units: one grammar, clean errors ---------------------------------------------------------


@pytest.mark.parametrize("text", ["9" * 400, "1" * 320 + "T", "9" * 400 + ".5K"])
def test_a_size_of_many_digits_is_that_many_bytes_not_a_crash(text: str) -> None:
    """`cache prune --max-bytes 999…9` (over 308 digits) raised OverflowError (float infinity
    to int), which the CLI's `except ValueError` let through as a traceback."""
    got = units.parse_bytes(text)
    assert got >= 10**300


def test_a_size_is_exact() -> None:
    assert units.parse_bytes("9007199254740993") == 9007199254740993  # a float rounds it
    assert units.parse_bytes("1.5K") == 1536
    assert units.parse_bytes("0.5") == 0
    assert units.parse_bytes("2GiB") == 2 * 1024**3


def test_cache_prune_with_a_huge_max_bytes_is_no_traceback(tmp_path: Path) -> None:
    env = {"RUNNER_STATE_DIR": str(tmp_path / "state"), "RUNNER_SERVER": "off"}
    proc = run_cli("cache", "prune", "--max-bytes", "9" * 400, env=env, timeout=120)
    assert "Traceback" not in proc.stderr and "OverflowError" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("text", ["1e309s", "1e308w", "9" * 400, "nan", "inf", "-1s", "1e9999"])
def test_a_duration_that_is_no_finite_number_is_a_clean_error(text: str) -> None:
    with pytest.raises(units.BadDuration):
        units.parse_seconds(text)
    with pytest.raises(units.BadDuration):
        units.parse_duration(text)


# -- locks ------------------------------------------------------------------------------------


def _held_elsewhere(path: Path) -> subprocess.Popen[str]:
    """Another process holding the flock of ``path`` (through whatever it names)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import fcntl,sys; f=open(sys.argv[1],'a'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
         str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_lock_probe_does_not_follow_a_link_a_co_tenant_planted(tmp_path: Path) -> None:
    """A GPU device's holder record (0666, in the host-wide 1777 folder: any user writes it)
    names the job folder whose record/lock the allocator probes. The probe followed a link
    there and opened (read-write, creating) and locked whatever it leads to; a runner's lock
    is never a link (the holder replaces one), so a link is no one's lock."""
    target = tmp_path / "elsewhere"
    target.write_text("")
    job = JobDir(tmp_path / "job")
    job.record.mkdir(parents=True)
    job.lock.symlink_to(target)
    other = _held_elsewhere(target)
    try:
        assert not locks.is_held(job.lock)
        assert not runner_alive(job.root)
    finally:
        other.communicate("")


def test_a_lock_probe_opens_no_fifo_or_device(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    os.mkfifo(lock)
    assert not locks.is_held(lock)  # and returns at once: no open of a FIFO waits
    assert not locks.is_held(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()


def test_a_lock_probe_still_sees_a_holder(tmp_path: Path) -> None:
    job = JobDir(tmp_path / "job")
    job.record.mkdir(parents=True)
    assert not runner_alive(job.root)
    with job.locked():
        assert runner_alive(job.root)
        assert locks.is_held(job.lock)
    assert not runner_alive(job.root)


def test_a_lock_this_user_may_not_read_is_taken_as_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What cannot be looked at is not reclaimed (before: a PermissionError out of the GPU
    allocator). The test command runs as root in CI, which reads any file, so the EACCES a
    user without read access gets is given by the os layer here."""
    lock = tmp_path / "lock"
    lock.write_text("")
    real_open = os.open

    def denied(path: object, flags: int, *args: object) -> int:
        if Path(str(path)) == lock:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(locks.os, "open", denied)
    assert locks.is_held(lock)
    monkeypatch.undo()
    assert not locks.is_held(lock)  # readable and free: no one holds it


# -- untrusted shapes: the weaker answer ------------------------------------------------------


@pytest.mark.parametrize("odd", [None, 0, "", [], {}, "false"])
def test_an_odd_rootless_field_reads_as_rootless(odd: object) -> None:
    """`bool(security.get("rootless", True))`: an engine answering null (or 0, "", []) was
    read as rootful, the stronger claim (rootless on cgroup v1 ignores every cap)."""
    info = {"host": {"security": {"rootless": odd}, "cgroupVersion": "v1"}}
    assert PodmanHost.from_info(info).rootless
    assert not PodmanHost.from_info({"host": {"security": {"rootless": False}}}).rootless


def test_an_api_servers_true_is_no_count_of_active_pods() -> None:
    assert apply.state_of({"status": {"active": True}})[0] == "pending"
    assert apply.state_of({"status": {"active": 1}})[0] == "running"
    assert apply.state_of({"status": {"active": 10**400}})[0] == "running"
    assert apply.state_of({"status": [], "metadata": "x"})[0] == "pending"


@pytest.mark.parametrize("odd", [False, 0.0, None, "0"])
def test_a_backoff_limit_that_is_not_the_integer_0_breaks_the_rules(odd: object) -> None:
    """`backoffLimit != 0`: JSON's false and 0.0 equal 0 in Python and passed."""
    job = {"kind": "Job", "spec": {"backoffLimit": odd}}
    assert any("backoffLimit" in r for r in render.check_rules([job]))
    job = {"kind": "Job", "spec": {"backoffLimit": 0}}
    assert not any("backoffLimit" in r for r in render.check_rules([job]))


# -- images: a pull the registry keeps failing -------------------------------------------------


class _Progress:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def stage(self, name: str, detail: str) -> None:
        self.lines.append(detail)

    def transfer(self, label: str, done: int, total: int) -> None:
        pass


def test_a_pull_the_registry_keeps_failing_is_image_unavailable_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, virtual_clock: VirtualClock
) -> None:
    """After the third failed pull (the registry answering 5xx each time) the retry let the
    registry module's TransientRegistryError (a plain Exception, no RunnerError) out of the
    run: a crash, not `image_unavailable` (retryable)."""
    from runner.core.errors import ImageUnavailable, RunnerError
    from runner.images import pins, registry
    from runner.testing import FakeBackend

    def failing(*_: object, **__: object) -> None:
        raise registry.TransientRegistryError("registry.example answered 503: down")

    monkeypatch.setattr(registry, "probe", lambda *_, **__: 1)
    monkeypatch.setattr(registry, "probe_once", failing)
    backend = FakeBackend()  # nothing pullable: every pull fails
    digest = "sha256:" + "a" * 64
    pin = pins.ImagePin(f"registry.example/x@{digest}", "registry.example/x", digest, None)
    progress = _Progress()
    settings = pins.PullSettings(docker_config=tmp_path / "none.json")
    with pytest.raises(RunnerError) as exc:
        pins._pull(backend, pin, settings, progress)
    assert isinstance(exc.value, ImageUnavailable) and exc.value.retryable
    assert "503" in str(exc.value)
    assert sum("retrying" in line for line in progress.lines) == 2  # three tries
    assert virtual_clock.sleeps == [2, 4]


# -- the submission store --------------------------------------------------------------------


def test_a_submission_record_that_is_a_link_is_neither_read_nor_appended_through(
    tmp_path: Path,
) -> None:
    """latest() read whatever a link at submissions.jsonl named (is_file and read_text follow
    it) and append() wrote through it."""
    from runner.core.errors import InfrastructureError
    from runner.scheduling import submissions

    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text('{"slurmJobId": "1"}\n')
    where = submissions.folder(tmp_path / "state", "slurm", "job-1")
    where.mkdir(parents=True)
    (where / submissions.FILE).symlink_to(elsewhere)
    with pytest.raises(InfrastructureError, match="link"):
        submissions.latest(tmp_path / "state", "slurm", "job-1")
    with pytest.raises(InfrastructureError):
        submissions.append(tmp_path / "state", "slurm", "job-1", {"slurmJobId": "2"})
    assert elsewhere.read_text() == '{"slurmJobId": "1"}\n'


def test_a_submission_record_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    from runner.core.errors import InfrastructureError
    from runner.scheduling import submissions

    where = submissions.folder(tmp_path, "kubernetes", "job-1")
    where.mkdir(parents=True)
    os.mkfifo(where / submissions.FILE)
    with pytest.raises(InfrastructureError, match="FIFO"):
        submissions.latest(tmp_path, "kubernetes", "job-1")


def test_only_the_end_of_a_long_submission_record_is_read(tmp_path: Path) -> None:
    """The whole file was read into memory for its last line."""
    from runner.core.errors import InfrastructureError
    from runner.scheduling import submissions

    where = submissions.folder(tmp_path, "slurm", "job-1")
    where.mkdir(parents=True)
    path = where / submissions.FILE
    line = '{"slurmJobId": "1", "pad": "' + "x" * 1000 + '"}\n'
    path.write_text(line * 3000)  # 3 MB
    submissions.append(tmp_path, "slurm", "job-1", {"slurmJobId": "42"})
    assert submissions.latest(tmp_path, "slurm", "job-1") == {"slurmJobId": "42"}
    assert submissions.latest(tmp_path, "slurm", "../job-1") is None  # no job id: no path
    path.write_text("x" * (submissions.MAX_LINE + 10))
    with pytest.raises(InfrastructureError, match="over"):
        submissions.latest(tmp_path, "slurm", "job-1")
    path.write_text("\n\n")
    assert submissions.latest(tmp_path, "slurm", "job-1") is None


@pytest.mark.parametrize("uid", [None, "", ["u"], {"a": 1}, 7])
def test_a_job_the_api_server_gives_no_uid_is_not_deleted_without_a_precondition(
    uid: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """delete() sent V1Preconditions(uid=None) for a Job whose answer had no uid (or a list):
    no precondition at all, so whatever Job held the name by then was deleted."""
    from runner.core.errors import InfrastructureError

    status = {"jobId": "job-1", "name": "runner-job-1", "namespace": "ns", "uid": uid}
    monkeypatch.setattr(apply, "status", lambda *_, **__: status)

    def no_client(*_: object) -> object:
        raise AssertionError("a client was made: the DELETE was about to be sent")

    monkeypatch.setattr(apply, "_client", no_client)
    with pytest.raises(InfrastructureError, match="no uid"):
        apply.delete("job-1", namespace="ns")
