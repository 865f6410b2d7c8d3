"""Jobs on the two-node cluster of scripts/setup_slurm_nodes.sh (partition `two`): Slurm's nodes
rnode1 and rnode2 are containers with their own hostnames and addresses, each running munged
and slurmd, under a second slurmctld on this host (SLURM_CONF=/etc/slurm-nodes/slurm.conf). A
job's `runner run` runs on a node and starts its job container on this host's engine (the
engine's socket is the node's); the state folder is an sshfs mount that both nodes and this
host see at the same path. A missing cluster fails these tests (never skips)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.state.ledger import read_state
from tests.support import SESSION_ID, SESSION_LABEL, docker, run_cli, write_contract
from tests.support.budget import COUNTING, true_seconds

pytestmark = [pytest.mark.docker, pytest.mark.slurm]

NODES = ("rnode1", "rnode2")
CONF = "/etc/slurm-nodes/slurm.conf"
SLURM = {**os.environ, "SLURM_CONF": CONF}
"""The environment of this file's Slurm commands: the two-node cluster's controller."""
_SUBMITTED: list[str] = []
"""The Slurm jobs the running test submitted (the ``shared`` fixture cancels them at its end)."""
SHARED = Path(os.environ.get("RUNNER_NODES_SHARED", "/var/lib/runner-nodes/shared"))
TOY_RUN = (
    "python3 /job/input/repository/evaluate.py --checkpoint /job/input/repository/checkpoint.json"
)


def _sinfo_two() -> dict[str, str]:
    out = subprocess.run(
        ["sinfo", "-h", "-p", "two", "-N", "-o", "%N %T"],
        capture_output=True, text=True, check=False, env=SLURM,
    ).stdout  # fmt: skip
    return dict(line.split(None, 1) for line in out.splitlines() if line.strip())


@pytest.fixture(scope="module")
def nodes(image_id: str) -> tuple[str, ...]:
    """Both nodes answer (idle or busy) and the shared folder is the sshfs mount."""
    if shutil.which("sbatch") is None:
        pytest.fail("Slurm is not installed: run scripts/setup.sh (scripts/setup_slurm.sh)")
    states = _sinfo_two()
    usable = {"idle", "mixed", "allocated", "completing"}
    if set(states) != set(NODES) or not all(s.rstrip("*") in usable for s in states.values()):
        pytest.fail(f"the two-node cluster is not up: {states!r} (scripts/setup_slurm_nodes.sh)")
    mounts = Path("/proc/self/mountinfo").read_text()
    if f" {SHARED} " not in mounts or "fuse.sshfs" not in mounts:
        pytest.fail(f"{SHARED} is not the sshfs mount scripts/setup_slurm_nodes.sh makes")
    return NODES


@pytest.fixture
def shared(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A folder of this test on the shared storage (the nodes see it at the same path), with an
    empty runner config of its own (the tests' own config folder is not on it)."""
    folder = SHARED / f"{SESSION_ID}-{request.node.name}"[:120]
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "config").mkdir(parents=True)
    yield folder
    # A test that failed midway leaves no job of its own queued or running on the cluster.
    for slurm_job in _SUBMITTED:
        subprocess.run(["scancel", slurm_job], capture_output=True, check=False, env=SLURM)
    _SUBMITTED.clear()
    shutil.rmtree(folder, ignore_errors=True)


def _env(shared: Path) -> dict[str, str]:
    return {"RUNNER_CONFIG_DIR": str(shared / "config"), "SLURM_CONF": CONF}


def submit(shared: Path, *contracts: Path, extra: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    proc = run_cli(
        "cluster", "submit", *map(str, contracts), "--to", "slurm", "--partition", "two",
        "--state-dir", str(shared / "state"), "--json", "--allow-unsigned",
        "--label", f"{SESSION_LABEL}={SESSION_ID}", *extra, env=_env(shared),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records: list[dict[str, Any]] = json.loads(proc.stdout)
    _SUBMITTED.extend(record["slurmJobId"] for record in records)
    return records


def wait(shared: Path, *jobs: str, timeout: float = 240) -> tuple[int, list[dict[str, Any]], str]:
    proc = run_cli(
        "job", "wait", *jobs, "--state-dir", str(shared / "state"), "--json",
        "--timeout", str(timeout), env=_env(shared), timeout=timeout + 30,
    )  # fmt: skip
    return proc.returncode, json.loads(proc.stdout or "[]"), proc.stderr


def scontrol(slurm_job: str) -> dict[str, str]:
    from runner.scheduling.slurm.cluster import parse_fields

    out = subprocess.run(
        ["scontrol", "-o", "show", "job", slurm_job],
        capture_output=True, text=True, check=True, env=SLURM,
    ).stdout  # fmt: skip
    return parse_fields(out)


def contract(shared: Path, job_id: str, image: str, sleep: int = 0) -> Path:
    def change(data: dict[str, Any]) -> None:
        data["jobId"] = job_id

    folder = shared / "contracts" / job_id
    folder.mkdir(parents=True)
    command = ["sh", "-c", f"sleep {sleep}; {TOY_RUN}"] if sleep else None
    if command is None:
        return write_contract(folder, image, change=change)
    return write_contract(folder, image, command=command, change=change)


def test_a_job_on_partition_two_runs_on_one_of_its_nodes(
    nodes: tuple[str, ...], image_id: str, shared: Path
) -> None:
    """The toy submitted to `two` runs on rnode1 or rnode2 (Slurm's NodeList), its runner there
    records that node's hostname as the attempt's host in the ledger and the envelope, and its
    container ran on this host's engine (the toy's accuracy 0.819 in the envelope)."""
    [queued] = submit(shared, contract(shared, "two-toy", image_id))
    code, [end], err = wait(shared, "two-toy")
    assert code == 0, (err, end)
    assert end["status"] == "succeeded" and end["slurmState"] == "COMPLETED"
    assert end["envelope"]["measurements"][0]["value"] == 0.819
    node = scontrol(queued["slurmJobId"])["NodeList"]
    assert node in nodes
    [attempt] = end["envelope"]["attempts"]
    assert attempt["host"] == node
    (recorded,) = read_state(ledger_of(shared, "two-toy")).attempts
    assert recorded.starting["host"]["name"] == node, recorded.starting
    assert containers(queued["slurmJobId"], every=True) == []


def ledger_of(shared: Path, job_id: str) -> Path:
    return shared / "state" / "jobs" / job_id / "record" / "ledger.jsonl"


NAMES = "runner-two-"
"""The start of this file's containers' names (its jobs are two-...): the single-node
cluster's jobs run on the same engine, with Slurm job ids of their own."""


def containers(slurm_job: str, every: bool = False) -> list[str]:
    """The job's containers on this host's engine, by the label its batch script puts on them:
    running ones (``every``: in any state)."""
    return docker(
        "ps", *(["-a"] if every else []), "-q", "--filter", f"label=slurm.job-id={slurm_job}",
        "--filter", f"name={NAMES}",
    ).stdout.split()  # fmt: skip


class Watch(threading.Thread):
    """Counts the job's running containers every 0.2 s (the engine's label filter), and the
    attempts they belong to, until stopped."""

    def __init__(self, slurm_job: str) -> None:
        super().__init__(daemon=True)
        self.slurm_job, self.most, self.attempts = slurm_job, 0, set[str]()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            out = docker(
                "ps", "--filter", f"label=slurm.job-id={self.slurm_job}",
                "--filter", f"name={NAMES}", "--format", '{{.Label "org.runner.attempt"}}',
            ).stdout.split()  # fmt: skip
            self.most = max(self.most, len(out))
            self.attempts.update(out)
            self.done.wait(0.2)


def _node_back(node: str) -> None:
    """Start a node's container again and wait (bounded) until Slurm has it back."""
    docker("start", node)
    deadline = time.monotonic() + 90
    while _sinfo_two().get(node, "").rstrip("*") not in {"idle", "mixed", "allocated"}:
        if "down" in _sinfo_two().get(node, "") or "drain" in _sinfo_two().get(node, ""):
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"],
                           capture_output=True, check=False, env=SLURM)  # fmt: skip
        assert time.monotonic() < deadline, f"{node} is not back: {_sinfo_two()}"
        time.sleep(1)


@pytest.mark.slow
def test_a_lost_node_requeues_the_job_to_the_other_node_within_one_budget(
    nodes: tuple[str, ...], image_id: str, shared: Path
) -> None:
    """The node running a job is lost: its container is killed (slurmd, the batch step and
    its `runner run` with it), while the job's container on this host's engine runs on. Slurm
    finds the node not responding (SlurmdTimeout 30 s), requeues the job, and it starts on
    the other node, whose runner takes attempt 1 over by the lease rule (it cannot ask the
    lost node's runner): attempt 1 `host-lost` on the lost node, attempt 2 `observed` on the
    other, the budget consumed is what the attempts add up to, the ledger verifies, and at no
    time (the engine asked every 0.2 s) do two containers of the job run at once."""
    job = "two-lost"
    # A lease of 15 s (runner run --lease): the takeover may come 30 s after attempt 1's last
    # heartbeat instead of 240 s. The job sleeps 20 s, so the lost node's container (on this
    # host's engine, which a real lost node would have taken down with it) has ended by the
    # time Slurm even finds the node gone (SlurmdTimeout 30 s).
    [queued] = submit(shared, contract(shared, job, image_id, sleep=20), extra=("--lease", "15"))
    slurm_job = queued["slurmJobId"]
    watch = Watch(slurm_job)
    watch.start()
    lost = ""
    try:
        deadline = time.monotonic() + 60
        while not containers(slurm_job):
            assert time.monotonic() < deadline, f"no container of {job}: {scontrol(slurm_job)}"
            time.sleep(0.3)
        lost = scontrol(slurm_job)["NodeList"]
        assert lost in nodes
        time.sleep(3)
        assert docker("kill", lost).returncode == 0
        # A requeued job waits cred_expire (120 s) before it may start: start it now instead.
        deadline = time.monotonic() + 120
        while (info := scontrol(slurm_job))["JobState"] != "RUNNING" or info["NodeList"] == lost:
            if info["JobState"] == "PENDING" and info.get("Reason") == "BeginTime":
                subprocess.run(["scontrol", "update", f"jobid={slurm_job}", "StartTime=now"],
                               check=False, env=SLURM)  # fmt: skip
            assert time.monotonic() < deadline, f"not requeued to the other node: {info}"
            time.sleep(1)
        other = info["NodeList"]
        assert other in nodes and other != lost
        code, [end], err = wait(shared, job, timeout=420)
    finally:
        watch.done.set()
        watch.join()
        if lost:
            _node_back(lost)
        for container in containers(slurm_job, every=True):
            docker("rm", "-f", container)
    assert code == 0, (err, end)
    assert end["status"] == "succeeded" and end["envelope"]["measurements"][0]["value"] == 0.819
    attempts = end["envelope"]["attempts"]
    assert [(a["attempt"], a["host"], a["how"]) for a in attempts] == [
        (1, lost, "host-lost"), (2, other, "observed")
    ]  # fmt: skip
    assert watch.most == 1 and watch.attempts == {"1", "2"}, (watch.most, watch.attempts)
    budget = end["envelope"]["budget"]
    assert budget["consumedSeconds"] == pytest.approx(sum(a["seconds"] for a in attempts), abs=0.01)
    assert attempts[1]["seconds"] >= 20 and budget["consumedSeconds"] <= budget["limitSeconds"]
    assert int(scontrol(slurm_job)["Restarts"]) >= 1
    verify = run_cli(
        "ledger", "verify", job, "--state-dir", str(shared / "state"), env=_env(shared)
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


def _on_node(node: str, *command: str) -> subprocess.CompletedProcess[str]:
    """A command inside a node's container, with the cluster's slurm.conf."""
    return docker("exec", "-e", f"SLURM_CONF={CONF}", node, *command)


def test_the_epilog_on_a_node_stops_the_orphan_and_the_other_node_continues_the_budget(
    nodes: tuple[str, ...], image_id: str, shared: Path
) -> None:
    """The batch step's runner is SIGKILLed on its node (the node lives on): that node's Epilog
    (scripts/slurm-epilog.sh, run by its slurmd, its `docker` and runner at the host's paths)
    stops the container left on the engine and records attempt 1 `orphan-stopped` with that
    node's name; the job requeued and kept off that node runs attempt 2 on the other within the
    same budget, attempt 1's container ended before attempt 2's started, and none is left."""
    job = "two-epilog"
    [queued] = submit(shared, contract(shared, job, image_id, sleep=15))
    slurm_job = queued["slurmJobId"]
    deadline = time.monotonic() + 60
    while not containers(slurm_job):
        assert time.monotonic() < deadline, f"no container of {job}: {scontrol(slurm_job)}"
        time.sleep(0.3)
    first = scontrol(slurm_job)["NodeList"]
    assert first in nodes
    time.sleep(2)
    pids = _on_node(first, "scontrol", "listpids", slurm_job).stdout.splitlines()[1:]
    runner_pid = next(line.split()[0] for line in pids if line.split()[2:3] == ["batch"])
    cmdline = _on_node(first, "cat", f"/proc/{runner_pid}/cmdline").stdout
    assert "runner" in cmdline, cmdline
    assert _on_node(first, "sh", "-c", f"kill -KILL {runner_pid}").returncode == 0
    deadline = time.monotonic() + 60
    while scontrol(slurm_job)["JobState"] not in {"FAILED", "COMPLETED"}:
        assert time.monotonic() < deadline, scontrol(slurm_job)
        time.sleep(0.3)
    assert containers(slurm_job) == [], "the Epilog on the node stopped what the runner left"
    (one,) = read_state(ledger_of(shared, job)).attempts
    assert one.finished is not None and one.finished["how"] == "orphan-stopped", one.finished
    assert one.starting["host"]["name"] == first
    # A credential issued in the second the job ended is refused ("Job credential revoked").
    time.sleep(1.5)
    other = next(n for n in nodes if n != first)
    for change in (["requeuehold", slurm_job],
                   ["update", f"jobid={slurm_job}", f"ExcNodeList={first}", "StartTime=now"],
                   ["release", slurm_job]):  # fmt: skip
        done = subprocess.run(["scontrol", *change], capture_output=True, text=True, env=SLURM)
        assert done.returncode == 0, (change, done.stderr)
    try:
        code, [end], err = wait(shared, job)
    finally:
        for container in containers(slurm_job, every=True):
            docker("rm", "-f", container)
    assert code == 0, (err, end)
    assert end["status"] == "succeeded"
    attempts = end["envelope"]["attempts"]
    assert [(a["attempt"], a["host"], a["how"]) for a in attempts] == [
        (1, first, "orphan-stopped"), (2, other, "observed")
    ]  # fmt: skip
    assert scontrol(slurm_job)["NodeList"] == other
    kept = shared / "state" / "jobs" / job / "record" / "attempts"
    states = [json.loads((kept / n / "container-state.json").read_text()) for n in "12"]
    assert states[0]["FinishedAt"] < states[1]["StartedAt"], "never two containers at once"
    budget = end["envelope"]["budget"]
    assert budget["consumedSeconds"] == pytest.approx(sum(a["seconds"] for a in attempts), abs=0.01)
    # Attempt 2 on top of attempt 1: at least its container's own running time (the engine's
    # StartedAt lags the process's start on a loaded machine, so not a bare 15).
    ran = true_seconds(shared / "state" / "jobs" / job, 2)
    assert ran >= 14, "attempt 2 ran the whole job again"
    assert budget["consumedSeconds"] >= one.seconds + ran - COUNTING
    verify = run_cli(
        "ledger", "verify", job, "--state-dir", str(shared / "state"), env=_env(shared)
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
