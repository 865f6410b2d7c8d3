"""`runner submit --to slurm`, `runner wait`, `runner cancel`, `runner status`: jobs queued in
the real single-node Slurm that scripts/setup_slurm.sh starts, run by `runner run` on the node
with the real Docker engine. A missing or stopped Slurm fails these tests (never skips)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from runner.app import host
from runner.backends.types import Limits
from runner.core.errors import PolicyViolation
from runner.planning.allocation import check_allocation
from runner.scheduling.slurm import batch
from runner.scheduling.slurm.cluster import Cluster, parse_fields
from runner.state.ledger import Ledger, read_state
from tests.support import (
    SESSION_ID,
    SESSION_LABEL,
    docker,
    run_cli,
    start_job,
    write_contract,
)
from tests.support.budget import COUNTING, true_seconds

pytestmark = [pytest.mark.docker, pytest.mark.slurm]

TOY_RUN = (
    "python3 /job/input/repository/evaluate.py --checkpoint /job/input/repository/checkpoint.json"
)


@pytest.fixture(scope="module")
def cluster(image_id: str) -> Cluster:
    """The single-node cluster, idle or busy; fails (not skips) when it does not answer."""
    if shutil.which("sbatch") is None:
        pytest.fail("Slurm is not installed: run scripts/setup.sh (scripts/setup_slurm.sh)")
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, check=False)
    if out.returncode != 0 or not {"idle", "mixed", "allocated"} & set(out.stdout.split()):
        pytest.fail(f"Slurm does not answer or has no usable node: {out.stderr or out.stdout!r} "
                    "(scripts/setup_slurm.sh starts it)")  # fmt: skip
    return Cluster()


def submit(
    state: Path, *contracts: Path, extra: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "submit", *map(str, contracts), "--to", "slurm", "--state-dir", str(state), "--json",
        "--allow-unsigned", "--label", f"{SESSION_LABEL}={SESSION_ID}",
        *extra,
    )  # fmt: skip


def wait(state: Path, *jobs: str, timeout: float = 150) -> tuple[int, list[dict[str, Any]], str]:
    proc = run_cli(
        "wait", *jobs, "--state-dir", str(state), "--json", "--timeout", str(timeout),
        timeout=timeout + 30,
    )  # fmt: skip
    return proc.returncode, json.loads(proc.stdout or "[]"), proc.stderr


def job_containers(job_id: str) -> list[str]:
    """Containers of this job (any state) still on the engine."""
    return docker("ps", "-aq", "--filter", f"name=runner-{job_id}").stdout.split()


def queued_names() -> list[str]:
    return subprocess.run(
        ["squeue", "-h", "-o", "%j"], capture_output=True, text=True, check=False
    ).stdout.split()


def scontrol(slurm_job: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", slurm_job], capture_output=True, text=True, check=True
    ).stdout
    return parse_fields(out)


def sleeper(folder: Path, seconds: int, job_id: str, image: str) -> Path:
    """A contract that sleeps, then writes the toy's result."""

    def change(data: dict[str, Any]) -> None:
        data["jobId"] = job_id

    folder.mkdir(parents=True, exist_ok=True)
    return write_contract(
        folder, image, command=["sh", "-c", f"sleep {seconds}; {TOY_RUN}"], change=change
    )


def toy(folder: Path, job_id: str, image: str) -> Path:
    def change(data: dict[str, Any]) -> None:
        data["jobId"] = job_id

    folder.mkdir(parents=True, exist_ok=True)
    return write_contract(folder, image, change=change)


def test_toy_job_runs_on_the_node_and_wait_gives_its_envelope(
    cluster: Cluster, image_id: str, tmp_path: Path
) -> None:
    """The toy contract through sbatch: the envelope (accuracy 0.819) is in the shared state
    folder, `runner wait` exits 0 with it, `runner status` shows the Slurm job, and the sbatch
    options come from the plan (1 CPU, 512 + 512 MiB, 15 + 5 s + 60 s rounded up: 17 min)."""
    state = tmp_path / "state"
    contract = toy(tmp_path / "toy", "slurm-toy", image_id)
    proc = submit(state, contract)
    assert proc.returncode == 0, proc.stderr
    [queued] = json.loads(proc.stdout)
    assert queued["jobId"] == "slurm-toy" and queued["slurmJobId"].isdigit()
    assert (queued["cpus"], queued["memMiB"], queued["timeMinutes"]) == (1, 1024, 17)
    info = scontrol(queued["slurmJobId"])
    assert info["TimeLimit"] == "00:17:00"
    assert info["Requeue"] == "1" and info["NumCPUs"] == "1"
    assert "runner-job=slurm-toy" in info.get("Comment", "")
    code, [end], err = wait(state, "slurm-toy")
    assert code == 0, err
    assert end["status"] == "succeeded" and end["slurmState"] == "COMPLETED"
    assert end["envelope"]["measurements"][0]["value"] == 0.819
    stored = json.loads((state / "jobs" / "slurm-toy" / "result.json").read_text())
    assert stored["status"] == "succeeded" and stored["measurements"][0]["value"] == 0.819
    again = run_cli("wait", "slurm-toy", "--state-dir", str(state))  # for people: a line a job
    assert again.returncode == 0
    assert again.stdout.startswith("[1/1] slurm-toy: succeeded: toy-accuracy = 0.819")
    status = run_cli("status", "slurm-toy", "--state-dir", str(state), "--json")
    assert json.loads(status.stdout)["slurm"]["slurmJobId"] == queued["slurmJobId"]
    lines = (state / "slurm" / "slurm-toy" / "submissions.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["contractSha256"] == queued["contractSha256"]
    assert job_containers("slurm-toy") == []


def test_a_signed_contract_runs_signed_on_the_node(
    cluster: Cluster, image_id: str, tmp_path: Path
) -> None:
    """A signed toy contract, submitted without --allow-unsigned and with --trusted-keys: the
    node's runner gets the same trusted keys and the envelope records the verified signature."""
    keys = tmp_path / "trusted"
    assert run_cli("keygen", "--out", str(tmp_path / "issuer")).returncode == 0
    trust = run_cli("trust", str(tmp_path / "issuer.pub"), "--trusted-keys", str(keys))
    assert trust.returncode == 0, trust.stderr
    toy(tmp_path / "c", "slurm-signed", image_id)
    signed = run_cli(
        "sign", str(tmp_path / "c" / "task.json"), "--key", str(tmp_path / "issuer.key"),
        "--expires-in", "1h",
    )  # fmt: skip
    assert signed.returncode == 0, signed.stderr
    state = tmp_path / "state"
    proc = run_cli(
        "submit", str(tmp_path / "c" / "task.dsse.json"), "--to", "slurm", "--state-dir",
        str(state), "--trusted-keys", str(keys), "--json",
        "--label", f"{SESSION_LABEL}={SESSION_ID}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    code, [end], err = wait(state, "slurm-signed")
    assert code == 0, err
    assert end["envelope"]["signature"]["status"] == "verified"
    assert end["envelope"]["measurements"][0]["value"] == 0.819


def test_twenty_contracts_at_once_all_succeed(
    cluster: Cluster, image_id: str, tmp_path: Path
) -> None:
    """Twenty contracts in one `runner submit`: twenty Slurm jobs, every one succeeds, none is
    lost, and no container is left."""
    state = tmp_path / "state"
    ids = [f"slurm-many-{i:02d}" for i in range(20)]
    contracts = [toy(tmp_path / i, i, image_id) for i in ids]
    proc = submit(state, *contracts)
    assert proc.returncode == 0, proc.stderr
    queued = json.loads(proc.stdout)
    assert sorted(q["jobId"] for q in queued) == ids
    assert len({q["slurmJobId"] for q in queued}) == 20
    code, ends, err = wait(state, *ids, timeout=170)
    assert code == 0, err
    assert [e["jobId"] for e in ends] == ids
    assert {e["status"] for e in ends} == {"succeeded"}
    assert all(e["envelope"]["measurements"][0]["value"] == 0.819 for e in ends)
    assert docker("ps", "-aq", "--filter", f"label={SESSION_LABEL}={SESSION_ID}",
                  "--filter", "name=slurm-many").stdout.split() == []  # fmt: skip


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def client_pid(slurm_job: str) -> int:
    """The batch step's `runner run` process (not the step that runs it)."""
    out = subprocess.run(["scontrol", "listpids", slurm_job], capture_output=True, text=True,
                         check=True).stdout.splitlines()[1:]  # fmt: skip
    for line in out:
        pid = int(line.split()[0])
        argv = _cmdline(pid)
        if "runner" in argv and "run" in argv and "runner.scheduling.slurm.step" not in argv:
            return pid
    raise AssertionError(f"no `runner run` in Slurm job {slurm_job}: {out}")


def _wait_container(job_id: str, proc: subprocess.Popen[str] | None = None) -> None:
    deadline = time.monotonic() + 60
    while not docker("ps", "-q", "--filter", f"name=runner-{job_id}").stdout.split():
        assert proc is None or proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"no container of {job_id} started"
        time.sleep(0.3)


def test_requeue_after_the_runner_is_killed_continues_the_same_budget(
    cluster: Cluster, image_id: str, tmp_path: Path
) -> None:
    """The batch's runner is SIGKILLed mid-run. The Epilog (scripts/slurm-epilog.sh, which
    scripts/setup_slurm.sh installs) stops the container it left and records attempt 1 in the
    ledger before Slurm may start the job again; `scontrol requeue` then runs attempt 2 within
    the same budget. One container at a time (attempt 1's ended before attempt 2's was made),
    the ledger verifies, the envelope says succeeded, each attempt names this host."""
    state = tmp_path / "state"
    contract = sleeper(tmp_path / "c", 15, "slurm-requeue", image_id)
    proc = submit(state, contract)
    assert proc.returncode == 0, proc.stderr
    slurm_job = json.loads(proc.stdout)[0]["slurmJobId"]
    _wait_container("slurm-requeue")
    time.sleep(2)
    os.kill(client_pid(slurm_job), signal.SIGKILL)
    deadline = time.monotonic() + 60
    while scontrol(slurm_job)["JobState"] not in {"FAILED", "COMPLETED"}:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert job_containers("slurm-requeue") == [], "the Epilog stopped what the runner left"
    ledger = state / "jobs" / "slurm-requeue" / "record" / "ledger.jsonl"
    (first,) = read_state(ledger).attempts
    assert first.finished is not None and first.finished["how"] == "orphan-stopped"
    assert first.seconds >= 2
    # slurmd refuses a credential issued within the second its job ended ("Job credential
    # revoked"): requeue a second later, then skip the wait for cred_expire with StartTime=now.
    time.sleep(1.5)
    subprocess.run(["scontrol", "requeue", slurm_job], check=True)
    subprocess.run(["scontrol", "update", f"jobid={slurm_job}", "StartTime=now"], check=True)
    code, [end], err = wait(state, "slurm-requeue")
    assert code == 0, (err, end)
    assert end["status"] == "succeeded"
    attempts = end["envelope"]["attempts"]
    assert [(a["attempt"], a["how"]) for a in attempts] == [(1, "orphan-stopped"), (2, "observed")]
    assert {a["host"] for a in attempts} == {socket.gethostname()}
    # Attempt 2 is charged on top of attempt 1: at least its container's own running time
    # (the engine's StartedAt lags the process's start on a loaded machine, so not a bare 15).
    job_dir = state / "jobs" / "slurm-requeue"
    ran = true_seconds(job_dir, 2)
    assert ran >= 14, "attempt 2 ran the whole job again"
    assert end["envelope"]["budget"]["consumedSeconds"] >= first.seconds + ran - COUNTING
    assert scontrol(slurm_job)["Restarts"] == "1"
    kept = state / "jobs" / "slurm-requeue" / "record" / "attempts"
    one, two = (json.loads((kept / n / "container-state.json").read_text()) for n in "12")
    assert one["FinishedAt"] < two["StartedAt"], "never two containers of the job at once"
    verify = run_cli("ledger", "verify", "slurm-requeue", "--state-dir", str(state))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert job_containers("slurm-requeue") == []


def _ledger(state: Path, job_id: str, digest: str, limit: float, consumed: float) -> None:
    """A job accepted with ``limit`` seconds of which an attempt, cancelled, used ``consumed``."""
    path = state / "jobs" / job_id / "record" / "ledger.jsonl"
    path.parent.mkdir(parents=True)
    ledger = Ledger.open(path)
    ledger.append("job.accepted", "job.accepted",
                  {"jobId": job_id, "contractDigest": digest, "limitSeconds": limit})  # fmt: skip
    ledger.append("a1", "attempt.starting", {"attempt": 1, "containerName": "gone"})
    ledger.append("a1f", "attempt.finished",
                  {"attempt": 1, "seconds": consumed, "classification": "cancelled"})  # fmt: skip


def test_time_limit_is_the_budget_left_and_a_spent_budget_is_refused(
    cluster: Cluster, image_id: str, tmp_path: Path
) -> None:
    """A 60 s budget of which a first attempt (run here, stopped by SIGTERM) used over 6 s:
    --time 60 gives the job 2 minutes (what is left + 5 s + 60 s, rounded up; the whole
    budget would need 3), and the job runs as attempt 2 of the same budget; a job with no
    budget left is refused at submit (exit 1, resource_exhausted) and nothing is queued."""
    state = tmp_path / "state"

    def short(data: dict[str, Any]) -> None:
        data["jobId"] = "slurm-left"
        data["environment"]["timeoutMinutes"] = 1

    (tmp_path / "left").mkdir()
    contract = write_contract(
        tmp_path / "left", image_id, command=["sh", "-c", f"sleep 12; {TOY_RUN}"], change=short
    )
    first = start_job(contract, state)
    _wait_container("slurm-left", first)
    time.sleep(7)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 130, first.communicate()
    consumed = read_state(state / "jobs" / "slurm-left" / "record" / "ledger.jsonl").consumed
    assert 6 < consumed < 20
    proc = submit(state, contract, extra=("--time", "60"))
    assert proc.returncode == 0, proc.stderr
    [queued] = json.loads(proc.stdout)
    assert queued["timeMinutes"] == 2 and queued["budgetSeconds"] == pytest.approx(60 - consumed)
    assert scontrol(queued["slurmJobId"])["TimeLimit"] == "00:02:00"
    code, [end], err = wait(state, "slurm-left")
    assert code == 0, err
    assert [a["attempt"] for a in end["envelope"]["attempts"]] == [1, 2]
    assert end["envelope"]["budget"]["consumedSeconds"] > consumed

    spent = toy(tmp_path / "spent", "slurm-spent", image_id)
    _ledger(state, "slurm-spent", json.loads(spent.read_text())["contractDigest"], 900, 900)
    proc = submit(state, spent)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["category"] == "resource_exhausted"
    assert not (state / "slurm" / "slurm-spent").exists()
    assert "runner-slurm-spent" not in queued_names()


def test_a_refused_contract_queues_nothing(cluster: Cluster, image_id: str, tmp_path: Path) -> None:
    """A contract the policy refuses (it asks for network) is refused at submit with exit 3,
    and the good contract submitted with it is not queued either; a stop grace that Slurm's
    KillWait would cut short is refused naming KillWait."""
    state = tmp_path / "state"
    good = toy(tmp_path / "good", "slurm-good", image_id)

    def network(data: dict[str, Any]) -> None:
        data["jobId"] = "slurm-bad"
        data["environment"]["networkAccess"] = True

    (tmp_path / "bad").mkdir()
    bad = write_contract(tmp_path / "bad", image_id, change=network)
    proc = submit(state, good, bad)
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout)["category"] == "policy_violation"
    assert not (state / "slurm").exists()
    names = queued_names()
    assert "runner-slurm-good" not in names and "runner-slurm-bad" not in names
    proc = submit(state, good, extra=("--stop-grace", "40"))
    assert proc.returncode == 3 and "KillWait" in proc.stderr


def test_slurm_refusing_one_set_of_resources_queues_nothing(
    cluster: Cluster, image_id: str, tmp_path: Path
) -> None:
    """Alike contracts share one `sbatch --test-only`; a contract with other resources gets its
    own: Slurm refusing it (more memory than the node's RealMemory, which the host policy
    allows) is exit 3 and queues none of the others."""
    state = tmp_path / "state"
    first = toy(tmp_path / "a", "slurm-alike-a", image_id)
    second = toy(tmp_path / "b", "slurm-alike-b", image_id)

    node = subprocess.run(
        ["scontrol", "-o", "show", "node"], capture_output=True, text=True, check=True
    ).stdout
    real_mib = int(parse_fields(node)["RealMemory"])  # below the host's memory (setup_slurm.sh)

    def big(data: dict[str, Any]) -> None:
        data["jobId"] = "slurm-too-big"
        data["environment"]["memoryGb"] = round(real_mib / 1024, 3)  # + 512 MiB: above it

    (tmp_path / "big").mkdir()
    large = write_contract(tmp_path / "big", image_id, change=big)
    proc = submit(state, first, second, large)
    assert proc.returncode == 3, proc.stderr
    assert "Slurm refuses the job" in proc.stderr
    names = queued_names()
    assert not {"runner-slurm-alike-a", "runner-slurm-alike-b", "runner-slurm-too-big"} & set(names)
    assert not list((state / "slurm").glob("*/submissions.jsonl"))


def test_the_node_refuses_a_plan_larger_than_the_allocation(
    cluster: Cluster, image_id: str, tmp_path: Path
) -> None:
    """`runner run` in a Slurm job with 200 MiB refuses the toy's 512 MiB memory cap
    (policy_violation, naming the cap) before any container runs."""
    contract = toy(tmp_path / "c", "slurm-small", image_id)
    out = tmp_path / "envelope.json"
    argv = [
        sys.executable,
        "-m",
        "runner",
        "run",
        str(contract),
        "--json",
        "--state-dir",
        str(tmp_path / "s"),
        "--allow-unsigned",
        "--allow-unpinned-image",
    ]
    wrap = " ".join(argv) + f" > {out}"
    done = subprocess.run(
        ["sbatch", "--wait", "--cpus-per-task=1", "--mem=200M", "--time=2",
         f"--output={tmp_path}/slurm-%j.out", "--wrap", wrap],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    env = json.loads(out.read_text())
    assert done.returncode != 0
    assert env["failure"]["category"] == "policy_violation"
    assert (
        "memory cap (512 MiB) exceeds the Slurm job's allocation (200 MiB)"
        in env["failure"]["reason"]
    )
    assert job_containers("slurm-small") == []


def test_cancel_stops_a_running_job(cluster: Cluster, image_id: str, tmp_path: Path) -> None:
    """`runner cancel` on a running job: its runner stops the container on Slurm's SIGTERM,
    `runner wait` exits 130 with the envelope cancelled, and no container is left."""
    state = tmp_path / "state"
    contract = sleeper(tmp_path / "c", 120, "slurm-cancel", image_id)
    proc = submit(state, contract)
    assert proc.returncode == 0, proc.stderr
    _wait_container("slurm-cancel")
    cancel = run_cli("cancel", "slurm-cancel", "--state-dir", str(state), "--json")
    assert cancel.returncode == 0, cancel.stderr
    assert json.loads(cancel.stdout)[0]["cancelled"] is True
    code, [end], err = wait(state, "slurm-cancel", timeout=60)
    assert code == 130, err
    assert end["category"] == "cancelled" and end["slurmState"] == "CANCELLED"
    assert end["status"] == "failed"  # the envelope's word, as for one cancelled queued
    assert end["envelope"]["failure"]["category"] == "cancelled"
    assert job_containers("slurm-cancel") == []


def test_status_shows_a_job_slurm_still_holds_in_its_queue(
    cluster: Cluster, image_id: str, tmp_path: Path
) -> None:
    """`runner job status` of a job still PENDING (the node held whole by another Slurm job):
    it names the Slurm job and its state, exit 0, where it once said job_not_found;
    cancelled, it ends cancelled without ever having run."""
    state = tmp_path / "state"
    contract = toy(tmp_path / "toy", "slurm-held", image_id)
    blocker = subprocess.run(
        ["sbatch", "--parsable", "--exclusive", "--job-name", "runner-test-blocker",
         "--output", "/dev/null", "--wrap", "sleep 300"], capture_output=True, text=True,
        check=True,
    ).stdout.strip().split(";")[0]  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while scontrol(blocker)["JobState"] != "RUNNING":
            assert time.monotonic() < deadline, "the blocking job never started"
            time.sleep(0.5)
        proc = submit(state, contract)
        assert proc.returncode == 0, proc.stderr
        [queued] = json.loads(proc.stdout)
        _status_of_a_queued_job(state, queued["slurmJobId"])
    finally:
        subprocess.run(["scancel", blocker], check=False)
    code, [end], err = wait(state, "slurm-held", timeout=60)
    assert code == 130, err
    assert (end["status"], end["category"]) == ("failed", "cancelled")  # as a running one's
    assert job_containers("slurm-held") == []


def _status_of_a_queued_job(state: Path, slurm_job: str) -> None:
    """What `runner job status` says of slurm-held, PENDING; then `runner job cancel` it."""
    try:
        assert scontrol(slurm_job)["JobState"] == "PENDING"
        status = run_cli("job", "status", "slurm-held", "--state-dir", str(state), "--json")
        assert status.returncode == 0, status.stderr
        info = json.loads(status.stdout)
        assert info["slurm"]["slurmJobId"] == slurm_job
        assert info["slurm"]["state"] == "PENDING" and "PENDING" in info["state"]
        assert info["attempts"] == [] and info["consumedSeconds"] == 0.0
        text = run_cli("job", "status", "slurm-held", "--state-dir", str(state))
        assert text.returncode == 0, text.stderr
        assert f"Slurm job {slurm_job}: PENDING" in text.stdout
        unknown = run_cli("job", "status", "slurm-never", "--state-dir", str(state))
        assert unknown.returncode == 5, unknown.stderr  # still job_not_found when not queued
    finally:
        cancel = run_cli("job", "cancel", "slurm-held", "--state-dir", str(state), "--json")
    assert cancel.returncode == 0, cancel.stderr


def test_a_node_that_cannot_see_the_state_folder_fails_clearly(
    cluster: Cluster, image_id: str, tmp_path: Path
) -> None:
    """A batch whose marker is gone (the node does not see the state folder) exits before
    `runner run`; `runner wait` says infrastructure, naming the Slurm state and the log."""
    state = tmp_path / "state"
    contract = toy(tmp_path / "c", "slurm-blind", image_id)
    loaded, trust = host.load(None, None, allow_unsigned=True)
    req = batch.prepare(contract, loaded.policy, trust, state, job_id=None, stop_grace=5,
                        ceiling=None, offered=[])  # fmt: skip
    script = batch.write_batch(req, state, sys.executable, [])
    for marker in script.parent.glob("marker-*"):
        marker.unlink()
    folder = batch.record_dir(state, req.jobId)
    job = cluster.sbatch(
        batch.sbatch_args(req, folder=folder, partition=None, account=None), script
    )
    batch.record(state, req, job, {})
    code, [end], err = wait(state, "slurm-blind", timeout=60)
    assert code == 4, err
    assert end["category"] == "infrastructure" and end["slurmState"] == "FAILED"
    assert f"slurm-{job}.out" in end["reason"]
    assert "does not see the state folder" in (folder / f"slurm-{job}.out").read_text()


# ------------------------------------------------------------------ pure logic, no cluster


def test_time_is_rounded_up_and_never_above_the_ceiling() -> None:
    """--time: budget + grace + set-up allowance, in whole minutes rounded up, capped."""
    assert batch.time_minutes(900, 5, None) == 17
    assert batch.time_minutes(900, 5, 10) == 10
    assert batch.time_minutes(0.5, 5, None) == 2  # 65.5 s
    assert batch.time_minutes(55, 5, None) == 2


def test_allocation_check() -> None:
    """Under SLURM_JOB_ID, caps above SLURM_CPUS_ON_NODE / SLURM_MEM_PER_NODE /
    SLURM_MEM_PER_CPU x CPUs / SLURM_GPUS_ON_NODE are refused; without it nothing is checked."""
    limits = Limits(cpus=2, memory_bytes=2**30, memory_swap_bytes=2**30, shm_bytes=1,
                    pids=10, tmpfs_bytes=1, gpus=1, network="none", timeout_seconds=60)  # fmt: skip
    ok = {"SLURM_JOB_ID": "1", "SLURM_CPUS_ON_NODE": "2", "SLURM_MEM_PER_NODE": "1024",
          "SLURM_GPUS_ON_NODE": "1"}  # fmt: skip
    check_allocation(limits, ok)
    check_allocation(limits, {})
    for change, word in (
        ({"SLURM_CPUS_ON_NODE": "1"}, "CPU cap"),
        ({"SLURM_MEM_PER_NODE": "1023"}, "memory cap"),
        ({"SLURM_MEM_PER_NODE": "", "SLURM_MEM_PER_CPU": "500"}, "memory cap"),
        ({"SLURM_GPUS_ON_NODE": "0"}, "GPU count"),
    ):
        with pytest.raises(PolicyViolation, match=word):
            check_allocation(limits, {**ok, **change})


def test_state_folder_type_and_sharing() -> None:
    """The mount holding a path is the longest prefix in mountinfo; a local one is refused
    for a partition of several nodes, naming --state-dir."""
    info = (
        "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "40 22 0:50 / /shared rw - nfs4 srv:/x rw\n"
        "41 22 0:51 / /shared2 rw - xfs /dev/sdb rw\n"
    )
    assert batch.fs_type(Path("/shared/runner"), info) == "nfs4"
    assert batch.fs_type(Path("/shared2/x"), info) == "xfs"
    assert batch.fs_type(Path("/sharedX/x"), info) == "ext4"
    assert batch.check_state_dir(Path("/shared/r"), 8, "nfs4") is None
    assert "local" in (batch.check_state_dir(Path("/r"), 1, "ext4") or "")
    with pytest.raises(PolicyViolation, match="--state-dir"):
        batch.check_state_dir(Path("/r"), 2, "ext4")
    with pytest.raises(PolicyViolation, match="'%'"):  # sbatch would expand it in --output
        batch.check_state_dir(Path("/shared/100%j"), 8, "nfs4")


def test_gpu_types_and_grace() -> None:
    """A GPU type comes from the partition's gres (first preferred one offered); a stop grace
    needs KillWait 5 s longer."""
    assert batch.offered_gpu_types("gpu:h100:4(S:0-1)\ngpu:a100:2,gpu:h100:1\n(null)\n") == [
        "h100",
        "a100",
    ]
    assert batch.offered_gpu_types("gpu:4\n") == []
    batch.check_grace(25, 30)
    with pytest.raises(PolicyViolation, match="KillWait"):
        batch.check_grace(26, 30)


def test_benchmark_script_runs(cluster: Cluster, tmp_path: Path) -> None:
    """`scripts/bench_slurm.py --jobs 2` measures all three sides, every job succeeding, and
    writes its report where told."""
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "batch.md"
    script = root / "scripts" / "bench_slurm.py"
    done = subprocess.run(
        [sys.executable, str(script), "--jobs", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = out.read_text()
    assert "Throughput ratio" in report
    assert report.count("| 2 | 2 |") == 3  # jobs, succeeded: runner, served, baseline


def test_hostile_names_are_refused(tmp_path: Path) -> None:
    """A partition or account that is not a plain Slurm name (an option, a path) is refused
    before Slurm is asked; a job id that is not one (a path) is no submitted job (exit 5)."""
    for bad in ("--wrap=id", "../x", "a b", "", "x" * 65):
        with pytest.raises(PolicyViolation, match="--partition"):
            batch.check_name("--partition", bad)
    assert batch.check_name("--account", "lab-1.gpu_a") == "lab-1.gpu_a"
    (tmp_path / "slurm" / "x").mkdir(parents=True)
    (tmp_path / "slurm" / "x" / "submissions.jsonl").write_text('{"slurmJobId": "1"}\n')
    proc = run_cli("wait", "../slurm/x", "--state-dir", str(tmp_path / "state"), "--json")
    assert proc.returncode == 5 and "was never submitted" in proc.stderr
