"""Jobs run through `runner run` in real containers on the real engine."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import (
    ROOT,
    SESSION_ID,
    SESSION_LABEL,
    TOY,
    docker,
    run_cli,
    run_job,
    session_containers,
    start_job,
    write_contract,
)

pytestmark = pytest.mark.docker

PY = "python3"


def _py(code: str) -> list[str]:
    return [PY, "-c", code]


def _job_dir(envelope: dict[str, Any]) -> Path:
    return Path(envelope["jobDir"])


def _no_leftovers(envelope: dict[str, Any]) -> None:
    """No container of the job and no temporary file in its folder remain."""
    job = _job_dir(envelope)
    assert not [p for p in job.rglob("*.tmp")], list(job.rglob("*.tmp"))
    left = docker("ps", "-aq", "--filter", f"label=org.runner.job-id={envelope['jobId']}")
    assert left.stdout.split() == []


def test_toy_evaluation_end_to_end(tmp_path: Path, image_id: str) -> None:
    """pin + run through the CLI: accuracy 0.819 from the evidence file, status succeeded."""
    contract = TOY / "task.json"
    pinned = tmp_path / "task.json"
    (tmp_path / "repository").symlink_to(TOY / "repository")
    (tmp_path / "paper.md").symlink_to(TOY / "paper.md")
    proc = run_cli("pin", str(contract), "--image", "runner-cpu:local", "-o", str(pinned))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(pinned.read_text())["environment"]["image"] == image_id

    # Symlinked inputs are refused; plain copies are staged.
    code, env, _ = run_job(pinned, tmp_path / "state")
    assert code == 3 and env["failure"]["category"] == "invalid_contract"
    assert "symbolic link" in env["failure"]["reason"]
    for name in ("repository", "paper.md"):
        (tmp_path / name).unlink()
    subprocess.run(
        ["cp", "-r", str(TOY / "repository"), str(TOY / "paper.md"), str(tmp_path)], check=True
    )

    code, env, stderr = run_job(pinned, tmp_path / "state2")
    assert code == 0, stderr
    assert env["status"] == "succeeded" and env["failure"] is None and env["exitCode"] == 0
    server = docker("version", "--format", "{{.Server.Version}} {{.Server.APIVersion}}")
    version, api = server.stdout.split()
    assert env["engine"] == {"name": "docker", "version": version, "apiVersion": api}
    (m,) = env["measurements"]
    assert (m["measurementId"], m["metric"], m["unit"], m["value"]) == (
        "toy-accuracy",
        "accuracy",
        "fraction",
        0.819,
    )
    assert m["parser"] == {"id": "json.scalar", "version": "1"}
    evidence = _job_dir(env) / "output" / m["evidence"]["path"]
    assert m["evidence"]["sha256"] == "sha256:" + hashlib.sha256(evidence.read_bytes()).hexdigest()
    assert env["image"]["id"] == image_id
    assert env["limits"]["network"] == "none"
    assert env["limits"]["memorySwapBytes"] == env["limits"]["memoryBytes"]
    assert json.loads((_job_dir(env) / "result.json").read_text()) == env
    manifest = json.loads((_job_dir(env) / "execution" / "input-manifest.json").read_text())
    paths = {f["path"] for f in manifest["files"]}
    assert {"task.json", "paper.md", "repository/evaluate.py", "parser-catalog.json"} <= paths
    catalog = json.loads((_job_dir(env) / "input" / "parser-catalog.json").read_text())
    assert any(c["id"] == "json.scalar" and c["version"] == "1" for c in catalog)
    staged_task = _job_dir(env) / "input" / "task.json"
    assert staged_task.read_bytes() == pinned.read_bytes()
    _no_leftovers(env)

    # The same job id is not run twice by accident: a rerun prints the finished job's envelope.
    code, again, stderr = run_job(pinned, tmp_path / "state2")
    assert code == 0 and again == env
    assert "already finished" in stderr
    assert json.loads((_job_dir(env) / "result.json").read_text()) == env


def test_nonzero_exit_keeps_the_jobs_code(tmp_path: Path, image_id: str) -> None:
    """exit 3 is nonzero_exit with exit code 3; the reason points at stderr and quotes its end."""
    job = "import sys; print('checkpoint missing', file=sys.stderr); sys.exit(3)"
    contract = write_contract(tmp_path, image_id, command=_py(job))
    code, env, _ = run_job(contract, tmp_path / "state")
    assert code == 1
    assert env["status"] == "failed"
    assert env["failure"]["category"] == "nonzero_exit" and env["failure"]["stage"] == "container"
    assert env["exitCode"] == 3
    assert "logs/evaluation.err; it ends: checkpoint missing" in env["failure"]["reason"]
    _no_leftovers(env)


def test_memory_past_the_cap_is_oom(tmp_path: Path, image_id: str) -> None:
    """A job allocating past memoryGb is killed, and the envelope says oom (from OOMKilled)."""
    contract = write_contract(
        tmp_path,
        image_id,
        command=_py("b = []\nwhile True: b.append(bytearray(16 * 1024 * 1024))"),
        environment={"memoryGb": 0.0625},
    )
    code, env, _ = run_job(contract, tmp_path / "state")
    assert code == 1
    if env["failure"]["category"] == "nonzero_exit":
        # The kernel may refuse the allocation instead (a memory cgroup at its limit fails a
        # kernel allocation charged to it, such as a new mapping, with ENOMEM rather than
        # invoking the OOM killer): Python raises MemoryError and exits 1, the cap held. Seen
        # once in a gate under load; the OOMKilled -> oom mapping is checked here otherwise,
        # by the memory bomb of test_hostile.py and on the fake engine.
        stderr_log = Path(env["jobDir"]) / "output" / env["stderrPath"]
        assert env["exitCode"] == 1 and "MemoryError" in stderr_log.read_text(), env
        assert env["container"]["oomKilled"] is False
    else:
        assert env["failure"]["category"] == "oom"
        assert env["container"]["oomKilled"] is True
    _no_leftovers(env)


def test_sleep_past_the_budget_is_a_timeout(tmp_path: Path, image_id: str) -> None:
    """The runner's own deadline stops the job within a few seconds of the budget."""
    budget = 3.0
    contract = write_contract(
        tmp_path,
        image_id,
        command=_py("import time; time.sleep(120)"),
        environment={"timeoutMinutes": budget / 60},
    )
    t0 = time.monotonic()
    code, env, _ = run_job(contract, tmp_path / "state", "--stop-grace", "2")
    wall = time.monotonic() - t0
    assert code == 1
    assert env["failure"]["category"] == "timeout"
    assert env["container"]["stoppedByRunner"] is True
    assert budget <= env["timings"]["runSeconds"] < budget + 4
    assert wall < budget + 15
    _no_leftovers(env)


PROBE = r"""
import json, socket
out = {}
for name, path in (("input", "/job/input/x"), ("root", "/etc/x"), ("usr", "/usr/x"),
                   ("execution", "/job/execution/x"), ("output", "/job/output/x"),
                   ("workspace", "/job/workspace/x"), ("tmp", "/tmp/x")):
    try:
        open(path, "w").write("x")
        out[name] = "written"
    except OSError as exc:
        out[name] = exc.errno
try:
    socket.create_connection(("1.1.1.1", 53), timeout=3)
    out["network"] = "connected"
except OSError as exc:
    out["network"] = type(exc).__name__
import os
out["uid"] = os.getuid()
print(json.dumps(out))
"""


def test_sealed_box(tmp_path: Path, image_id: str) -> None:
    """Input, execution and root filesystems are read-only; output, workspace and /tmp are
    writable; a socket to 1.1.1.1 fails; the job is not root."""
    contract = write_contract(
        tmp_path,
        image_id,
        command=_py(PROBE),
        measurements=[
            {
                "measurementId": "uid",
                "metric": "uid",
                "unit": "count",
                "parser": {
                    "id": "json.scalar",
                    "version": "1",
                    "evidencePath": "logs/probe.json",
                    "config": {"pointer": "/uid"},
                },
            }
        ],
        protocol={"stdoutPath": "logs/probe.json"},
    )
    code, env, stderr = run_job(contract, tmp_path / "state")
    assert code == 0, (env, stderr)
    probe = json.loads((_job_dir(env) / "output" / "logs" / "probe.json").read_text())
    # EROFS, not EACCES: the mounts and the root filesystem are read-only, whoever writes.
    assert probe["input"] == probe["root"] == probe["usr"] == probe["execution"] == errno.EROFS
    assert probe["output"] == probe["workspace"] == probe["tmp"] == "written"
    assert probe["network"] != "connected"
    assert probe["uid"] != 0
    assert env["measurements"][0]["value"] == probe["uid"]
    _no_leftovers(env)


def test_missing_evidence(tmp_path: Path, image_id: str) -> None:
    """A job that exits 0 without writing its evidence file fails with missing_evidence."""
    metric = {
        "measurementId": "m",
        "metric": "accuracy",
        "unit": "fraction",
        "parser": {
            "id": "json.scalar",
            "version": "1",
            "evidencePath": "results/metrics.json",
            "config": {"pointer": "/a"},
        },
    }
    contract = write_contract(tmp_path, image_id, command=["true"], measurements=[metric])
    code, env, _ = run_job(contract, tmp_path / "state")
    assert code == 1
    assert env["status"] == "failed" and env["exitCode"] == 0
    assert env["failure"]["category"] == "missing_evidence"
    assert env["failure"]["stage"] == "parsers"
    assert "results/metrics.json" in env["failure"]["reason"]
    _no_leftovers(env)


def test_non_json_evidence_is_a_parse_error(tmp_path: Path, image_id: str) -> None:
    contract = write_contract(tmp_path, image_id, command=_py("print('accuracy: 0.819')"))
    code, env, _ = run_job(contract, tmp_path / "state")
    assert code == 1
    assert env["failure"]["category"] == "parse_error"
    assert env["measurementErrors"][0]["measurementId"] == "toy-accuracy"
    _no_leftovers(env)


def test_partial_when_some_measurements_parse(tmp_path: Path, image_id: str) -> None:
    good = {
        "measurementId": "a",
        "metric": "accuracy",
        "unit": "fraction",
        "parser": {
            "id": "json.scalar",
            "version": "1",
            "evidencePath": "logs/evaluation.log",
            "config": {"pointer": "/a"},
        },
    }
    bad = {**good, "measurementId": "b", "parser": {**good["parser"], "config": {"pointer": "/b"}}}
    contract = write_contract(
        tmp_path, image_id, command=_py("print('{\"a\": 1}')"), measurements=[good, bad]
    )
    code, env, _ = run_job(contract, tmp_path / "state")
    assert code == 1
    assert env["status"] == "partial"
    assert [m["measurementId"] for m in env["measurements"]] == ["a"]
    assert env["failure"]["category"] == "parse_error"


def test_missing_image_is_image_unavailable(tmp_path: Path, image_id: str) -> None:
    contract = write_contract(tmp_path, "sha256:" + "0" * 64, command=["true"])
    code, env, _ = run_job(contract, tmp_path / "state")
    assert code == 4
    assert env["failure"]["category"] == "image_unavailable"


def test_unreachable_registry_is_retried_within_its_bound(tmp_path: Path, image_id: str) -> None:
    """A registry that never answers is retried for registryRetrySeconds, then the job fails
    image_unavailable (retryable), with nothing started."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"registryRetrySeconds": 2}))
    contract = write_contract(
        tmp_path, f"127.0.0.1:{port}/runner/toy@sha256:" + "1" * 64, command=["true"]
    )
    t0 = time.monotonic()
    code, env, _ = run_job(contract, tmp_path / "state", "--policy", str(policy))
    assert time.monotonic() - t0 < 30
    assert code == 4
    assert env["failure"]["category"] == "image_unavailable"
    assert env["failure"]["retryable"] is True
    assert "kept failing for 2 s" in env["failure"]["reason"]
    assert env["container"] is None


def test_unreachable_engine_is_infrastructure(tmp_path: Path, image_id: str) -> None:
    """An engine that cannot be reached is the runner's failure, never the job's."""
    contract = write_contract(tmp_path, image_id, command=["true"])
    code, env, _ = run_job(
        contract, tmp_path / "state", env={"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"}
    )
    assert code == 4
    assert env["failure"]["category"] == "infrastructure"
    assert env["failure"]["retryable"] is True


def test_running_job_has_every_cap_and_sigterm_stops_it(tmp_path: Path, image_id: str) -> None:
    """`docker inspect` of a running job shows the caps; SIGTERM to the runner stops the
    container, removes it, and still writes an envelope."""
    # Sleeps on the first attempt; a rerun finds its marker in the kept workspace and exits.
    once = (
        "import os, sys, time\nif os.path.exists('marker'): sys.exit(0)\n"
        "open('marker', 'w').close()\ntime.sleep(120)"
    )
    contract = write_contract(
        tmp_path,
        image_id,
        command=_py(once),
        environment={
            "cpus": 0.5,
            "memoryGb": 0.25,
            "shmGb": 0.03125,
            "pidsLimit": 64,
            "tmpfsMb": 32,
        },
    )
    state = tmp_path / "state"
    proc = start_job(contract, state, "--label", "probe=caps")
    try:
        deadline = time.monotonic() + 60
        found: list[str] = []
        while time.monotonic() < deadline and proc.poll() is None:
            found = docker(
                "ps",
                "-q",
                "--filter",
                "label=probe=caps",
                "--filter",
                f"label={SESSION_LABEL}={SESSION_ID}",
            ).stdout.split()
            if found:
                break
            time.sleep(0.2)
        assert found, f"the job's container never showed up running: {proc.communicate()}"
        info = json.loads(docker("inspect", found[0]).stdout)[0]
        hc, cfg = info["HostConfig"], info["Config"]
        assert hc["NetworkMode"] == "none"
        assert hc["ReadonlyRootfs"] is True
        assert hc["CapDrop"] == ["ALL"] and not hc.get("CapAdd")
        assert "no-new-privileges" in hc["SecurityOpt"]
        assert hc["Memory"] == hc["MemorySwap"] == 256 * 1024**2
        assert hc["NanoCpus"] == 500_000_000
        assert hc["ShmSize"] == 32 * 1024**2
        assert hc["PidsLimit"] == 64
        assert hc["Init"] is True
        assert hc["Privileged"] is False
        assert hc["LogConfig"]["Type"] == "json-file" and "max-size" in hc["LogConfig"]["Config"]
        assert hc["Tmpfs"]["/tmp"].endswith(f"size={32 * 1024**2}")
        assert cfg["User"] == (
            "10001:10001" if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}"
        )
        assert cfg["Image"] == image_id
        assert "NVIDIA_VISIBLE_DEVICES=void" in cfg["Env"], "a CPU job sees no GPU"
        assert cfg["Labels"]["org.runner.managed"] == "true"
        mounts = {m["Destination"]: m["RW"] for m in info["Mounts"]}
        assert mounts == {
            "/job/input": False,
            "/job/output": True,
            "/job/workspace": True,
            "/job/runtime-cache": True,
            "/job/runtime-venv": True,
            "/job/assets": False,
            "/job/execution": False,
        }
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    env = json.loads(out)
    assert env["failure"]["category"] == "cancelled"
    assert env["container"]["stoppedByRunner"] is True
    assert (state / "jobs" / env["jobId"] / "result.json").exists()
    assert docker("ps", "-aq", "--filter", "label=probe=caps").stdout.split() == []

    # An interrupted job may be run again under the same id; the old envelope is kept.
    code, again, _ = run_job(contract, state)
    assert code == 1 and again["exitCode"] == 0, again
    assert again["failure"]["category"] == "parse_error"  # the once-job prints no evidence
    assert list((state / "jobs" / env["jobId"] / "record").glob("result-*.json"))


def test_no_temporary_files_left_behind(tmp_path: Path, image_id: str) -> None:
    """A run leaves nothing in its temp folder (a test-owned TMPDIR: other programs on the
    machine may come and go in the system's /tmp)."""
    temp = tmp_path / "tmpdir"
    temp.mkdir()
    contract = write_contract(tmp_path, image_id, command=["true"])
    code, _, stderr = run_job(contract, tmp_path / "state", env={"TMPDIR": str(temp)})
    assert code == 1, stderr  # ran, wrote no evidence: missing_evidence
    assert sorted(temp.iterdir()) == []
    assert session_containers() == []


def test_signed_toy_run_records_who_signed(tmp_path: Path, image_id: str) -> None:
    """keygen → trust → sign → run, with no --allow-unsigned: the envelope records the key id,
    payloadType, times and the policy; the signed envelope is staged beside task.json."""
    keys = tmp_path / "trusted"
    assert run_cli("keygen", "--out", str(tmp_path / "issuer")).returncode == 0
    trusted = run_cli("trust", str(tmp_path / "issuer.pub"), "--trusted-keys", str(keys), "--json")
    keyid = json.loads(trusted.stdout)["keyId"]
    contract = write_contract(tmp_path, image_id)
    signed = run_cli("sign", str(contract), "--key", str(tmp_path / "issuer.key"), "--json")
    assert signed.returncode == 0, signed.stderr
    envelope_path = Path(json.loads(signed.stdout)["envelope"])
    code, env, stderr = run_job(
        envelope_path, tmp_path / "state", "--trusted-keys", str(keys), unsigned=False
    )
    assert code == 0, stderr
    assert env["measurements"][0]["value"] == 0.819
    sig = env["signature"]
    assert sig["status"] == "verified" and sig["keyIds"] == [keyid]
    assert sig["payloadType"] == "application/vnd.citeark.execution-contract+json"
    assert sig["expiresAt"] and sig["issuedAt"]
    assert env["policy"]["source"] == "defaults" and env["policy"]["digest"].startswith("sha256:")
    assert env["warnings"] == []
    staged = _job_dir(env) / "input"
    assert (staged / "task.dsse.json").read_bytes() == envelope_path.read_bytes()

    unsigned_code, unsigned, _ = run_job(contract, tmp_path / "state-unsigned")
    assert unsigned_code == 0
    assert unsigned["signature"]["status"] == "none"
    assert any("signature: none" in w for w in unsigned["warnings"])


BUDGET_PROBE = (
    "import json, time\n"
    "budget = json.load(open('/job/execution/runtime-budget.json'))\n"
    "print(json.dumps(budget))\n"
    "time.sleep(1.2)\n"
)


def test_reruns_share_one_budget(tmp_path: Path, image_id: str) -> None:
    """A finished job is not rerun by accident; --rerun runs it again under the same budget,
    which the job reads shrinking; once spent, nothing starts (resource_exhausted)."""
    probe = {
        "measurementId": "consumed",
        "metric": "consumedSeconds",
        "unit": "s",
        "parser": {
            "id": "json.scalar",
            "version": "1",
            "evidencePath": "logs/evaluation.log",
            "config": {"pointer": "/consumedSeconds"},
        },
    }
    contract = write_contract(
        tmp_path,
        image_id,
        command=_py(BUDGET_PROBE),
        measurements=[probe],
        environment={"timeoutMinutes": 3.0 / 60},
    )
    state = tmp_path / "state"
    code, first, _ = run_job(contract, state)
    assert code == 0 and first["measurements"][0]["value"] == 0
    code, shown, stderr = run_job(contract, state)
    assert code == 0 and shown == first and "--rerun" in stderr

    code, second, _ = run_job(contract, state, "--rerun")
    assert code == 0
    seen = second["measurements"][0]["value"]
    assert seen == pytest.approx(first["timings"]["runSeconds"], abs=0.01)

    code, third, _ = run_job(contract, state, "--rerun")
    assert code == 1 and third["failure"]["category"] == "timeout"
    spent = sum(e["timings"]["runSeconds"] for e in (first, second, third))
    assert spent == pytest.approx(3.0, abs=1.5)

    code, fourth, _ = run_job(contract, state, "--rerun")
    assert code == 1
    assert fourth["failure"]["category"] == "resource_exhausted"
    assert fourth["container"] is None


def test_a_relative_state_dir_is_taken_from_where_the_command_runs(
    tmp_path: Path, image_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--state-dir state` used to reach the engine as a relative mount source (refused: "mount
    path must be absolute"); it is the folder below the command's working directory."""
    contract = write_contract(tmp_path, image_id)
    monkeypatch.chdir(tmp_path)
    code, env, stderr = run_job(contract, Path("state"))
    assert code == 0, stderr
    assert Path(env["jobDir"]).is_absolute()
    assert Path(env["jobDir"]).parent.parent == tmp_path / "state"


FEATURES = ("runner.gpu", "runner.egress", "runner.agents.transcript", "runner.caches.assets",
            "runner.caches.download", "subprocess")  # fmt: skip
"""What a job that uses no GPU, egress allowlist, agent or asset imports none of (issue #29:
nothing on the path of a job that does not use a feature costs it anything)."""


def test_a_job_without_features_imports_none_of_theirs(tmp_path: Path, image_id: str) -> None:
    """The toy contract run by a fresh `runner` process, to its envelope: ``-X importtime``
    lists none of :data:`FEATURES` (together about 12 ms of each fresh run before)."""
    contract = write_contract(tmp_path, image_id)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RUNNER_SERVER": "off"}
    argv = [sys.executable, "-X", "importtime", "-m", "runner", "run", str(contract),
            "--allow-unsigned", "--json", "--state-dir", str(tmp_path / "state")]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["status"] == "succeeded"
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "runner.execution.orchestrator" in imported
    found = sorted(m for m in imported if any(m == f or m.startswith(f + ".") for f in FEATURES))
    assert found == []
