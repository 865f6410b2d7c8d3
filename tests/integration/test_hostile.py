"""Hostile jobs, under runc and under gVisor's runsc: each case asserts the outcome category and
that the host (and the runner) were unaffected.

With HOSTILE_REPORT_FILE=<file> set, each case appends one JSON line (case, runtime, outcome,
caps, host measurements) for scripts/hostile_report.py to publish.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.support import SESSION_ID, SESSION_LABEL, docker, write_contract
from tests.support.hostile import RUNTIMES, measured_run, probe_measurement, py, record

pytestmark = [pytest.mark.docker, pytest.mark.hostile]


FORK_BOMB = r"""
import json, os, time
made = 0
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    made += 1
    if made > 5000:
        break
json.dump({"ok": made}, open("/job/output/probe.json", "w"))
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_fork_bomb(tmp_path: Path, image_id: str, runtime: str) -> None:
    """Under runc the pids cap holds (forks fail past it); under runsc the bomb's tasks live in
    gVisor's sandbox and the memory cap ends it. Either way the host still forks."""
    contract = write_contract(
        tmp_path,
        image_id,
        command=py(FORK_BOMB),
        measurements=probe_measurement(),
        environment={"pidsLimit": 64, "memoryGb": 0.25, "timeoutMinutes": 0.5},
    )
    code, env, err, peak = measured_run(contract, tmp_path / "state", runtime)
    assert subprocess.run(["true"], check=False).returncode == 0  # the host still forks
    if runtime == "runc":
        assert code == 0, (env, err)
        made = env["measurements"][0]["value"]
        assert made < 64
        assert env["limits"]["pidsLimit"] == 64
    else:
        assert env["limits"]["pidsLimit"] is None
        # The memory cap ends it: oom, or (as with the memory bomb) the sandbox killed at the
        # cap, exit 137, with no OOMKilled from the engine under runsc (seen in a gate).
        held = env["failure"]["category"] in {"oom", "timeout"} or env["exitCode"] == 137
        assert held, env["failure"]
        made = None
    record("fork bomb", runtime, env, held=True, processesMade=made, runnerPeakRss=peak)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_memory_bomb(tmp_path: Path, image_id: str, runtime: str) -> None:
    bomb = "b = []\nwhile True: b.append(bytearray(16 * 1024 * 1024))"
    contract = write_contract(
        tmp_path, image_id, command=py(bomb), environment={"memoryGb": 0.125, "timeoutMinutes": 1}
    )
    code, env, err, peak = measured_run(contract, tmp_path / "state", runtime)
    assert code == 1, (env, err)
    if runtime == "runsc" and env["failure"]["category"] == "nonzero_exit":
        # gVisor may refuse the allocation itself: Python then raises MemoryError and exits 1.
        # Or the sandbox is killed at the cap (exit 137, SIGKILL) and the engine does not
        # report OOMKilled under runsc (seen once in a gate: 137, OOMKilled false, no stderr).
        stderr_log = Path(env["jobDir"]) / "output" / env["stderrPath"]
        assert env["exitCode"] == 137 or "MemoryError" in stderr_log.read_text(), env
    else:
        assert env["failure"]["category"] == "oom"
    record("memory bomb", runtime, env, held=True, runnerPeakRss=peak)


FILLER = r"""
chunk = b"x" * (1 << 20)
with open("/job/workspace/fill.bin", "wb") as f:
    while True:
        f.write(chunk)
        f.flush()
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_disk_filler(tmp_path: Path, image_id: str, runtime: str) -> None:
    """Filling workspace/ past diskGb stops the job (disk_quota_exceeded); the host's free
    space stays above a floor; the files stay for inspection."""
    free_before = shutil.disk_usage(tmp_path).free
    quota = 0.125
    contract = write_contract(
        tmp_path, image_id, command=py(FILLER), environment={"diskGb": quota, "timeoutMinutes": 2}
    )
    code, env, err, peak = measured_run(contract, tmp_path / "state", runtime)
    free_after_run = shutil.disk_usage(tmp_path).free
    assert code == 1, (env, err)
    assert env["failure"]["category"] == "disk_quota_exceeded"
    assert env["disk"]["peakBytes"] > quota * 1024**3
    assert (Path(env["jobDir"]) / "workspace" / "fill.bin").exists()
    floor = free_before - 4 * 1024**3
    assert free_after_run > floor
    record(
        "disk filler",
        runtime,
        env,
        held=True,
        freeDiskBefore=free_before,
        freeDiskAfter=free_after_run,
        runnerPeakRss=peak,
    )


FLOOD = r"""
import os, sys
chunk = b"log line, over and over, filling the disk if nobody stops it\n" * 1024
total = int(sys.argv[1])
out = os.fdopen(1, "wb", buffering=0)
while total > 0:
    out.write(chunk)
    total -= len(chunk)
print("done", file=sys.stderr)
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_log_flood(tmp_path: Path, image_id: str, runtime: str) -> None:
    """Gigabytes on stdout: the file keeps its first and last parts under the cap, the rest is
    counted as dropped, and the runner's memory stays bounded."""
    flood = 2 * 1024**3 if runtime == "runc" else 512 * 1024**2
    contract = write_contract(
        tmp_path,
        image_id,
        command=[*py(FLOOD), str(flood)],
        environment={"logLimitMb": 8, "timeoutMinutes": 3},
    )
    code, env, err, peak = measured_run(contract, tmp_path / "state", runtime)
    stdout_log = next(log for log in env["logs"] if log["path"].endswith(".log"))
    assert env["exitCode"] == 0, (code, env, err)
    assert stdout_log["size"] <= 8 * 1024**2 + 200
    assert stdout_log["droppedBytes"] >= flood - 8 * 1024**2 - 200
    text = (Path(env["jobDir"]) / "output" / stdout_log["path"]).read_bytes()
    assert b"bytes of this log were dropped past its cap" in text
    assert peak < 150 * 1024**2
    record(
        "log flood",
        runtime,
        env,
        held=True,
        floodBytes=flood,
        keptBytes=stdout_log["size"],
        droppedBytes=stdout_log["droppedBytes"],
        runnerPeakRss=peak,
    )


def _bridge_gateway() -> str:
    out = docker("network", "inspect", "bridge", "--format", "{{(index .IPAM.Config 0).Gateway}}")
    return out.stdout.strip() or "172.17.0.1"


EGRESS = r"""
import json, socket, sys
results = {}
for name, host, port in (("outside", "1.1.1.1", 53), ("bridge", sys.argv[1], int(sys.argv[2])),
                         ("loopback", "127.0.0.1", int(sys.argv[2]))):
    try:
        socket.create_connection((host, port), timeout=3).close()
        results[name] = "connected"
    except OSError as exc:
        results[name] = type(exc).__name__
results["ok"] = int(all(v != "connected" for v in results.values()))
json.dump(results, open("/job/output/probe.json", "w"))
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_network_egress(tmp_path: Path, image_id: str, runtime: str) -> None:
    """An outside address, the host's docker bridge and 127.0.0.1 are all unreachable, while
    the host listens on the bridge and loopback."""
    server = socket.socket()
    server.bind(("0.0.0.0", 0))  # noqa: S104 - a listener the job must fail to reach
    server.listen()
    port = server.getsockname()[1]
    try:
        contract = write_contract(
            tmp_path,
            image_id,
            command=[*py(EGRESS), _bridge_gateway(), str(port)],
            measurements=probe_measurement(),
        )
        code, env, err, peak = measured_run(contract, tmp_path / "state", runtime)
    finally:
        server.close()
    assert code == 0, (env, err)
    assert env["measurements"][0]["value"] == 1
    record("network egress", runtime, env, held=True, runnerPeakRss=peak)


ESCALATE = r"""
import json, os, subprocess
r = {}
places = (("root", "/etc/x"), ("input", "/job/input/x"), ("execution", "/job/execution/x"))
for name, path in places:
    try:
        open(path, "w").close()
        r[name] = "written"
    except OSError as exc:
        r[name] = exc.errno
try:
    os.setuid(0)
    r["setuid"] = "became root"
except OSError as exc:
    r["setuid"] = exc.errno
su = subprocess.run(["su", "-c", "id -u", "root"], capture_output=True, text=True,
                    input="\n", timeout=10)
r["su"] = su.stdout.strip() or su.returncode
status = open("/proc/self/status").read()
r["noNewPrivs"] = [l.split()[1] for l in status.splitlines() if l.startswith("NoNewPrivs")]
r["capEff"] = [l.split()[1] for l in status.splitlines() if l.startswith("CapEff")]
r["dockerSocket"] = os.path.exists("/var/run/docker.sock")
r["hostWork"] = os.path.exists("/work") or os.path.exists("/root/.local")
r["euid"] = os.geteuid()
r["ok"] = int(r["setuid"] != "became root" and r["su"] != "0" and r["euid"] != 0
             and not r["dockerSocket"] and not r["hostWork"]
             and all(r[k] != "written" for k in ("root", "input", "execution")))
json.dump(r, open("/job/output/probe.json", "w"))
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_escalation_and_host_access(tmp_path: Path, image_id: str, runtime: str) -> None:
    """Read-only root, input and execution; setuid and su gain nothing (no-new-privileges, no
    capabilities); neither the docker socket nor host folders are there."""
    contract = write_contract(
        tmp_path, image_id, command=py(ESCALATE), measurements=probe_measurement()
    )
    code, env, err, peak = measured_run(contract, tmp_path / "state", runtime)
    assert code == 0, (env, err)
    probe = json.loads((Path(env["jobDir"]) / "output" / "probe.json").read_text())
    assert probe["ok"] == 1, probe
    if runtime == "runc":
        assert probe["noNewPrivs"] == ["1"] and probe["capEff"] == ["0000000000000000"]
    record("escalation and host access", runtime, env, held=True, probe=probe, runnerPeakRss=peak)


PLANT = r"""
import os
os.makedirs("/job/output/logs", exist_ok=True)
os.symlink("/etc/shadow", "/job/output/evidence.json")
os.symlink("/", "/job/output/hostroot")
os.remove("/job/output/logs/evaluation.err")
os.symlink("/etc/passwd", "/job/output/logs/evaluation.err")
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_symlinks_to_host_paths_are_not_followed(
    tmp_path: Path, image_id: str, runtime: str
) -> None:
    """Links the job plants in output/ (to /etc/shadow, /, /etc/passwd as its stderr log) are
    neither read nor hashed nor written through by the runner."""
    passwd_before = Path("/etc/passwd").read_bytes()
    measurement = [
        {
            "measurementId": "m",
            "metric": "m",
            "unit": "x",
            "parser": {
                "id": "json.scalar",
                "version": "1",
                "evidencePath": "evidence.json",
                "config": {"pointer": "/a"},
            },
        }
    ]
    contract = write_contract(
        tmp_path,
        image_id,
        command=py(PLANT),
        measurements=measurement,
        environment={"logLimitMb": 0.001},
    )
    code, env, err, peak = measured_run(contract, tmp_path / "state", runtime)
    assert code == 1, (env, err)
    assert env["failure"]["category"] == "parse_error"
    assert "outside" in env["failure"]["reason"]
    stderr_log = next(log for log in env["logs"] if log["path"].endswith(".err"))
    assert stderr_log["exists"] is False and stderr_log["sha256"] is None
    assert Path("/etc/passwd").read_bytes() == passwd_before
    assert env["disk"]["usedBytes"] < 10 * 1024**2  # the link to / was not walked
    record("symlinks to host paths", runtime, env, held=True, runnerPeakRss=peak)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_sigterm_ignored_is_killed_after_grace(tmp_path: Path, image_id: str, runtime: str) -> None:
    stubborn = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)"
    contract = write_contract(
        tmp_path, image_id, command=py(stubborn), environment={"timeoutMinutes": 3 / 60}
    )
    t0 = time.monotonic()
    code, env, err, peak = measured_run(contract, tmp_path / "state", runtime, "--stop-grace", "2")
    wall = time.monotonic() - t0
    assert code == 1, (env, err)
    assert env["failure"]["category"] == "timeout"
    assert wall < 3 + 2 + 15
    record(
        "SIGTERM ignored", runtime, env, held=True, wallSeconds=round(wall, 1), runnerPeakRss=peak
    )


MANY = r"""
import json, os, sys
n = int(sys.argv[1])
base = "/job/workspace/many"
for d in range(n // 1000):
    os.makedirs(f"{base}/{d}", exist_ok=True)
    for i in range(1000):
        open(f"{base}/{d}/{i}", "w").close()
json.dump({"ok": n}, open("/job/output/probe.json", "w"))
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_many_tiny_files(tmp_path: Path, image_id: str, runtime: str) -> None:
    """A million files (a quarter under runsc): the quota is measured again and again while
    they are made, and the runner keeps its heartbeats going (it stays responsive)."""
    # A million files charge the kernel's inode and dentry caches to the job's memory cgroup
    # (cgroup v1 kmem accounting): at the toy's 512 MiB the job itself was once OOM-killed.
    count = int(os.environ.get("HOSTILE_FILES", "1000000"))
    if runtime == "runsc":
        count //= 4  # gVisor's file system calls are far slower; the point is the runner
    contract = write_contract(
        tmp_path,
        image_id,
        command=[*py(MANY), str(count)],
        measurements=probe_measurement(),
        environment={"timeoutMinutes": 10, "memoryGb": 2},
    )
    before = psutil.cpu_times()
    t0 = time.monotonic()
    code, env, err, peak = measured_run(contract, tmp_path / "state", runtime, "--heartbeat", "1")
    wall = time.monotonic() - t0
    assert code == 0, (env, err)
    assert env["measurements"][0]["value"] == count
    disk = env["disk"]
    assert disk["measurements"] >= 2
    ledger = (Path(env["jobDir"]) / "record" / "ledger.jsonl").read_text().splitlines()
    beats = [json.loads(x) for x in ledger if '"heartbeat"' in x]
    assert len(beats) >= max(1, int(env["timings"]["runSeconds"]) // 2 - 1), "runner stalled"
    record(
        "a million tiny files (a quarter under runsc)",
        runtime,
        env,
        held=True,
        files=count,
        wallSeconds=round(wall, 1),
        quotaMeasurements=disk["measurements"],
        hostCpuSecondsDelta=round(sum(psutil.cpu_times()) - sum(before), 1),
        runnerPeakRss=peak,
    )


DAEMON = r"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("python3", ["python3", "-c", "import time; time.sleep(300)", sys.argv[1]])
    os._exit(0)
time.sleep(0.5)
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_daemon_dies_with_the_job(tmp_path: Path, image_id: str, runtime: str) -> None:
    marker = f"runner-daemon-{uuid.uuid4().hex}"
    contract = write_contract(tmp_path, image_id, command=[*py(DAEMON), marker])
    code, env, err, peak = measured_run(contract, tmp_path / "state", runtime)
    assert env["exitCode"] == 0, (code, env, err)
    time.sleep(1)
    alive = [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]
    assert alive == []
    record("daemon outliving the job", runtime, env, held=True, runnerPeakRss=peak)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_toy_evaluation_under_each_runtime(tmp_path: Path, image_id: str, runtime: str) -> None:
    """The toy evaluation gives 0.819 under runc and runsc; the envelope says which ran it."""
    contract = write_contract(tmp_path, image_id)
    code, env, err, peak = measured_run(contract, tmp_path / "state", runtime)
    assert code == 0, (env, err)
    assert env["measurements"][0]["value"] == 0.819
    assert env["limits"]["runtime"] == runtime
    record("toy evaluation", runtime, env, held=True, runnerPeakRss=peak)


def test_runsc_demanded_but_missing_is_refused(tmp_path: Path, image_id: str) -> None:
    """A policy demanding runsc on an engine without it refuses the job (policy_violation)."""
    from runner.backends.docker import DockerBackend
    from runner.contract import Trust
    from runner.execution import orchestrator
    from runner.planning import policy

    class WithoutGvisor(DockerBackend):
        def runtimes(self) -> list[str]:
            return ["runc"]

    loaded = policy.LoadedPolicy(
        policy.HostPolicy(acceptUnsigned=True, isolation="runsc").resolved(), "test"
    )
    options = orchestrator.RunOptions(
        state_dir=tmp_path / "state",
        policy=loaded,
        trust=Trust(keys=[]),
        labels={SESSION_LABEL: SESSION_ID},
    )
    env = orchestrator.run(write_contract(tmp_path, image_id), options, backend=WithoutGvisor())
    assert env.failure is not None and env.failure.category == "policy_violation"
    assert "runsc" in env.failure.reason and env.container is None


def test_contract_asking_runc_where_runsc_is_demanded(tmp_path: Path, image_id: str) -> None:
    contract = write_contract(tmp_path, image_id, environment={"isolation": "runc"})
    code, env, _, _ = measured_run(contract, tmp_path / "state", "runsc")
    assert code == 3
    assert env["failure"]["category"] == "policy_violation"
    assert "$.environment.isolation" in env["failure"]["reason"]
