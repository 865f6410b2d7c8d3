"""A Slurm job whose runner lives on after its batch step's process (issue #30 items 1 and 2),
on the real single-node Slurm (scripts/setup_slurm.sh), the real Docker engine and a real
`runner serve`:

- the batch step's `runner run` client is killed (kill -9) while the node's `runner serve`
  runs the job: the step stays until the job ends, Slurm's job completes on its own and the
  node is never drained, `runner job wait` waits for the real end;
- the Epilog (scripts/slurm-epilog.sh, run here as Slurm runs it) finds a container whose
  job a live runner of the node owns: it leaves it running and succeeds;
- a takeover of an attempt whose Slurm job is still alive cancels that job and waits for its
  end before it starts a new attempt (fencing from the scheduler).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.core import locks
from runner.scheduling.slurm.cluster import Cluster
from runner.state.jobdir import JobDir
from runner.state.ledger import Ledger, read_state
from tests.integration.test_slurm import client_pid, job_containers, scontrol, sleeper, toy, wait
from tests.integration.test_slurm import cluster as cluster
from tests.support import SESSION_ID, SESSION_LABEL, docker, run_cli

pytestmark = [pytest.mark.docker, pytest.mark.slurm]

PARTITION = "debug"
"""scripts/setup_slurm.sh's partition of this host's node: the `runner serve` these tests
start, and the engine they look at, are this host's."""
NODE = "localhost"
"""Its node."""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The node's `runner serve`; the environment that points `runner run` at it."""
    env = {**os.environ, "RUNNER_SERVER": str(tmp_path / "s.sock")}
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        server = subprocess.Popen(
            [sys.executable, "-m", "runner", "serve"], env=env, stdout=sink, stderr=sink
        )
    try:
        deadline = time.monotonic() + 60
        while "listening on" not in log.read_text():
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield env
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def _drained() -> bool:
    """Whether this host's node (the one these tests run on) is drained or down."""
    out = subprocess.run(["sinfo", "-h", "-N", "-n", NODE, "-o", "%T"], capture_output=True,
                         text=True)  # fmt: skip
    return any("drain" in s or s.startswith("down") for s in out.stdout.split())


@pytest.fixture
def node_stays_up() -> Iterator[None]:
    """Fails the test when it left the node drained, and brings the node back then (so that a
    failure here does not fail every later Slurm test)."""
    before = _drained()
    yield
    if not before and _drained():
        subprocess.run(["scontrol", "update", f"nodename={NODE}", "state=resume"], check=False)
        pytest.fail("the node was drained (the Epilog failed)")


def _until(what: str, check: Any, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_killed_client_of_a_served_runner_never_ends_the_job_or_drains_the_node(
    cluster: Cluster, image_id: str, tmp_path: Path, served: dict[str, str], node_stays_up: None
) -> None:
    """The job runs in the node's `runner serve`; its batch step's client gets kill -9 once
    the container runs. The Slurm job stays RUNNING while the container does, `runner job
    wait` returns only at the job's real end (succeeded, 0.819) and Slurm records it
    COMPLETED (exit 0), the node is never drained and no container is left."""
    state = tmp_path / "state"
    contract = sleeper(tmp_path / "c", 12, "slurm-served", image_id)
    proc = run_cli(
        "submit", str(contract), "--to", "slurm", "--state-dir", str(state), "--json",
        "--allow-unsigned", "--label", f"{SESSION_LABEL}={SESSION_ID}", "--partition", PARTITION,
        env=served,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    slurm_job = json.loads(proc.stdout)[0]["slurmJobId"]
    try:
        _until("its container runs", lambda: docker(
            "ps", "-q", "--filter", "name=runner-slurm-served").stdout.split())  # fmt: skip
        os.kill(client_pid(slurm_job), signal.SIGKILL)
        time.sleep(3)  # on main, the batch step has ended by now and the Epilog has run
        assert docker("ps", "-q", "--filter", "name=runner-slurm-served").stdout.split(), (
            "the job's container runs on in the served runner"
        )
        assert scontrol(slurm_job)["JobState"] == "RUNNING", "the batch step stays"
        code, [end], err = wait(state, "slurm-served", timeout=120)
        assert code == 0, (err, end)
        assert end["status"] == "succeeded"
        assert end["envelope"]["measurements"][0]["value"] == 0.819
        assert job_containers("slurm-served") == [], "the container ended before wait did"
        _until("Slurm's job ends", lambda: scontrol(slurm_job)["JobState"] != "RUNNING", 30)
        info = scontrol(slurm_job)
        assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), info
        assert not _drained()
        log = (state / "slurm" / "slurm-served" / f"slurm-{slurm_job}.out").read_text()
        assert "this batch step stays until it ends" in log
    finally:
        if scontrol(slurm_job)["JobState"] in {"PENDING", "RUNNING"}:
            subprocess.run(["scancel", slurm_job], check=False)


def test_the_epilog_leaves_a_live_served_runners_container_and_succeeds(
    image_id: str, tmp_path: Path, served: dict[str, str]
) -> None:
    """scripts/slurm-epilog.sh, run as Slurm runs it, for a job whose `runner run` client was
    killed while the node's `runner serve` runs it on: the container is left running (its
    runner owns the job and watches it), the Epilog exits 0 and its log says why; the job
    then ends as it would have, succeeded. The same Epilog still stops the container of a
    runner that is dead (test_slurm's requeue test)."""
    state = tmp_path / "state"
    contract = sleeper(tmp_path / "c", 8, "epilog-served", image_id)
    client = subprocess.Popen(
        [sys.executable, "-m", "runner", "run", str(contract), "--state-dir", str(state),
         "--json", "--allow-unsigned", "--label", f"{SESSION_LABEL}={SESSION_ID}",
         "--label", "slurm.job-id=990001"],
        env=served, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    _until("its container runs", lambda: docker(
        "ps", "-q", "--filter", "name=runner-epilog-served").stdout.split())  # fmt: skip
    client.kill()
    client.wait(timeout=10)
    log = tmp_path / "epilog.log"
    runner = f"{sys.executable} -m runner"
    epilog = subprocess.run(
        ["sh", str(Path(__file__).parents[2] / "scripts" / "slurm-epilog.sh")],
        env={**served, "SLURM_JOB_ID": "990001", "RUNNER": runner, "RUNNER_EPILOG_LOG": str(log)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    said = log.read_text()
    assert epilog.returncode == 0, said + epilog.stderr
    assert "a live runner here still owns it" in said
    assert "a live runner on this host owns its job and watches it" in said
    assert docker("ps", "-q", "--filter", "name=runner-epilog-served").stdout.split()
    _until("the job ends", lambda: (state / "jobs" / "epilog-served" / "result.json").is_file())
    done = json.loads((state / "jobs" / "epilog-served" / "result.json").read_text())
    assert done["status"] == "succeeded"
    _until("its container is removed", lambda: job_containers("epilog-served") == [], 30)
    first = read_state(state / "jobs" / "epilog-served" / "record" / "ledger.jsonl").attempts[0]
    assert first.finished is not None and first.finished["classification"] != "interrupted"


def test_cancel_after_the_client_died_stops_the_served_runners_job(
    cluster: Cluster, image_id: str, tmp_path: Path, served: dict[str, str], node_stays_up: None
) -> None:
    """The client is killed, then `runner job cancel`: the batch step passes Slurm's SIGTERM
    on to the served runner that owns the job (record/owner.json, checked against the
    process's start time), which stops its container and records the attempt cancelled;
    `runner job wait` exits 130, the node is not drained, no container is left."""
    state = tmp_path / "state"
    contract = sleeper(tmp_path / "c", 120, "slurm-served-cancel", image_id)
    proc = run_cli(
        "submit", str(contract), "--to", "slurm", "--state-dir", str(state), "--json",
        "--allow-unsigned", "--label", f"{SESSION_LABEL}={SESSION_ID}", "--partition", PARTITION,
        env=served,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    slurm_job = json.loads(proc.stdout)[0]["slurmJobId"]
    try:
        _until("its container runs", lambda: docker(
            "ps", "-q", "--filter", "name=runner-slurm-served-cancel").stdout.split())  # fmt: skip
        os.kill(client_pid(slurm_job), signal.SIGKILL)
        time.sleep(2)
        cancel = run_cli("cancel", "slurm-served-cancel", "--state-dir", str(state))
        assert cancel.returncode == 0, cancel.stderr
        code, [end], err = wait(state, "slurm-served-cancel", timeout=60)
        assert code == 130, (err, end)
        _until("its container is removed", lambda: job_containers("slurm-served-cancel") == [], 30)
        ledger = state / "jobs" / "slurm-served-cancel" / "record" / "ledger.jsonl"
        (first,) = read_state(ledger).attempts
        assert first.finished is not None and first.finished["classification"] == "cancelled"
        _until("Slurm's job ends", lambda: scontrol(slurm_job)["JobState"] == "CANCELLED", 30)
        assert not _drained()
    finally:
        if scontrol(slurm_job)["JobState"] in {"PENDING", "RUNNING"}:
            subprocess.run(["scancel", slurm_job], check=False)


def test_a_takeover_cancels_the_earlier_attempts_live_slurm_job_first(
    cluster: Cluster, image_id: str, tmp_path: Path
) -> None:
    """Attempt 1 of a job was started on host node-a inside Slurm job J (as `runner run`
    records it: ``slurm.jobId``), and its heartbeats stopped; J still runs. A runner here
    takes the job over: past the two leases it asks Slurm, which says J is RUNNING, so it
    cancels J and waits for Slurm to say it ended (its Epilog included) before it charges
    attempt 1 (to now) and starts attempt 2, which succeeds. Without the fence (main) J is
    left running beside attempt 2."""
    alive = subprocess.run(
        ["sbatch", "--parsable", "--job-name=runner-test-fence", "--time=5", "--output=/dev/null",
         f"--partition={PARTITION}",
         "--wrap", "sleep 300"], capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        _until("J runs", lambda: scontrol(alive)["JobState"] == "RUNNING", 60)
        contract = toy(tmp_path / "c", "slurm-fence", image_id)
        digest = json.loads(contract.read_text())["contractDigest"]
        # The image and engine records of a real attempt of this contract, for node-a's.
        before = run_cli("run", str(contract), "--state-dir", str(tmp_path / "once"),
                         "--allow-unsigned", "--label", f"{SESSION_LABEL}={SESSION_ID}",
                         env={"RUNNER_SERVER": "off"})  # fmt: skip
        assert before.returncode == 0, before.stderr
        (real,) = read_state(tmp_path / "once" / "jobs" / "slurm-fence" / "record" /
                             "ledger.jsonl").attempts  # fmt: skip
        state = tmp_path / "state"
        path = state / "jobs" / "slurm-fence" / "record" / "ledger.jsonl"
        path.parent.mkdir(parents=True)
        ledger = Ledger.open(path)
        accepted = {"jobId": "slurm-fence", "contractDigest": digest, "limitSeconds": 900}
        ledger.append("job.accepted", "job.accepted", accepted)
        ledger.append("attempt-1.starting", "attempt.starting",
                      {"attempt": 1, "containerName": "runner-slurm-fence-gone-a1",
                       "host": {"name": "node-a", "bootId": "elsewhere"}, "leaseSeconds": 1.0,
                       "image": real.starting["image"], "engine": real.starting["engine"],
                       "slurm": {"jobId": alive, "node": "localhost", "restarts": 0}})  # fmt: skip
        proc = run_cli(
            "run", str(contract), "--state-dir", str(state), "--json", "--allow-unsigned",
            "--label", f"{SESSION_LABEL}={SESSION_ID}", env={"RUNNER_SERVER": "off"},
        )  # fmt: skip
        env = json.loads(proc.stdout)
        assert proc.returncode == 0, (proc.stderr, env["failure"])
        assert env["status"] == "succeeded"
        assert [(a["attempt"], a["how"]) for a in env["attempts"]] == [
            (1, "host-lost"), (2, "observed")
        ]  # fmt: skip
        info = scontrol(alive)
        assert info["JobState"] == "CANCELLED", "the earlier attempt's job was cancelled"
        first, second = read_state(path).attempts
        assert first.finished is not None
        assert first.finished["slurm"] == {
            "jobId": alive, "cancelled": True, "state": "CANCELLED", "was": "RUNNING"
        }  # fmt: skip
        ended = time.mktime(time.strptime(info["EndTime"], "%Y-%m-%dT%H:%M:%S"))
        assert ended <= second.starting_at.timestamp() + 1, "J ended before attempt 2 started"
        said = proc.stderr
        assert said.index(f"Slurm job {alive} is still RUNNING: cancelling it") < said.index(
            "starting a new attempt here"
        )
    finally:
        subprocess.run(["scancel", alive], check=False)


def test_the_epilog_stops_a_dead_runners_container_while_another_host_holds_the_job(
    image_id: str, tmp_path: Path
) -> None:
    """A takeover on another host holds the job's lock (shared through the state folder's
    storage; here this test process holds it, owner.json naming node-b) while it waits for
    this node's Slurm job to end; the runner here was killed, its container runs on. The
    Epilog stops and removes that container without the lock, writes nothing to the ledger
    (node-b charges the attempt) and succeeds, so the Slurm job ends and the takeover goes
    on with no container of the job left here."""
    contract = sleeper(tmp_path / "c", 60, "epilog-elsewhere", image_id)
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", "run", str(contract), "--state-dir", str(state),
         "--json", "--allow-unsigned", "--label", f"{SESSION_LABEL}={SESSION_ID}",
         "--label", "slurm.job-id=990002", "--heartbeat", "0.5"],
        env={**os.environ, "RUNNER_SERVER": "off"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    _until("its container runs", lambda: docker(
        "ps", "-q", "--filter", "name=runner-epilog-elsewhere").stdout.split())  # fmt: skip
    proc.kill()
    proc.wait(timeout=10)
    job = JobDir(state / "jobs" / "epilog-elsewhere")
    before = job.ledger.read_bytes()
    with locks.flocked(job.lock) as got:
        assert got
        (job.record / "owner.json").write_text(json.dumps({"pid": 4242, "startTicks": 1,
                                         "host": {"name": "node-b", "bootId": "b"}}))  # fmt: skip
        log = tmp_path / "epilog.log"
        epilog = subprocess.run(
            ["sh", str(Path(__file__).parents[2] / "scripts" / "slurm-epilog.sh")],
            env={**os.environ, "SLURM_JOB_ID": "990002", "RUNNER": f"{sys.executable} -m runner",
                 "RUNNER_EPILOG_LOG": str(log)},
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        said = log.read_text()
        assert epilog.returncode == 0, said + epilog.stderr
        assert "held by a runner on host node-b: stopped" in said
        assert job_containers("epilog-elsewhere") == [], "stopped and removed"
        assert job.ledger.read_bytes() == before, "nothing written: node-b charges it"
