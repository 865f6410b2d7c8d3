"""Regression tests for the holes a security review found working as a hostile contract author
or a hostile job (issue 12). Each test reproduces one hole against the real engine and asserts
that it stays closed. With HOSTILE_REPORT_FILE set, each case is recorded for
scripts/hostile_report.py like the cases of tests/integration/test_hostile.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import stat
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from runner.contract import with_digest
from tests.support import (
    docker,
    json_measurement,
    run_cli,
    run_job,
    running_containers,
    start_job,
    wait_running,
    write_contract,
)
from tests.support.hostile import RUNTIMES, measured_run, py, record

pytestmark = [pytest.mark.docker, pytest.mark.hostile]

GIB = 1024**3
MIB = 1024**2


def _edit(contract: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    data = json.loads(contract.read_text())
    data.pop("contractDigest")
    change(data)
    contract.write_text(json.dumps(with_digest(data), indent=2))
    return contract


def _refused(code: int, env: dict[str, Any], stderr: str, category: str, *words: str) -> str:
    assert code == 3, (env, stderr)
    assert env["failure"]["category"] == category, env["failure"]
    reason = str(env["failure"]["reason"])
    for word in words:
        assert word in reason, reason
    assert env["container"] is None  # nothing ran
    return reason


def _sign(tmp_path: Path, contract: Path, expires: str = "1h") -> tuple[Path, Path]:
    """Sign ``contract`` with a fresh issuer key the returned folder trusts."""
    keys = tmp_path / "trusted"
    if not (tmp_path / "issuer.key").exists():
        assert run_cli("keygen", "--out", str(tmp_path / "issuer")).returncode == 0
        trusted = run_cli("trust", str(tmp_path / "issuer.pub"), "--trusted-keys", str(keys))
        assert trusted.returncode == 0, trusted.stderr
    signed = run_cli(
        "sign", str(contract), "--key", str(tmp_path / "issuer.key"), "--expires-in", expires,
        "--json",
    )  # fmt: skip
    assert signed.returncode == 0, signed.stderr
    return Path(json.loads(signed.stdout)["envelope"]), keys


# --------------------------------------------------------------------- 1. input paths


def test_input_path_through_a_linked_middle_folder(tmp_path: Path, image_id: str) -> None:
    """`ln -s /etc etc` beside the contract and paper.path etc/shadow: refused, nothing of
    /etc staged (only the last component used to be checked for a link)."""
    folder = tmp_path / "c"
    folder.mkdir()
    os.symlink("/etc", folder / "etc")
    contract = _edit(
        write_contract(folder, image_id, command=["true"]),
        lambda d: d["paper"].update(path="etc/shadow"),
    )
    code, env, err = run_job(contract, tmp_path / "state")
    reason = _refused(code, env, err, "invalid_contract", "$.paper.path", "symbolic link")
    assert "etc" in reason
    staged = list((tmp_path / "state").rglob("shadow"))
    assert staged == []
    record("input path through a linked folder", "runc", env, held=True)


def test_runner_keys_are_never_staged(tmp_path: Path, image_id: str) -> None:
    """The runner's own key material cannot be staged into a job: not through a link to the
    config folder, not by naming the config folder itself, not from a contract inside it."""
    config = tmp_path / "conf"
    env_vars = {"RUNNER_CONFIG_DIR": str(config)}
    (tmp_path / "first").mkdir()
    first = write_contract(tmp_path / "first", image_id)
    code, env, err = run_job(first, tmp_path / "state", env=env_vars)
    assert code == 0, (env, err)
    key = config / "runner-key" / "runner.key"
    assert key.exists() and stat.S_IMODE(key.stat().st_mode) == 0o600

    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(config, linked / "cfg")
    via_link = _edit(
        write_contract(linked, image_id, command=["true"]),
        lambda d: d["repository"].update(path="cfg/runner-key"),
    )
    code, env, err = run_job(via_link, tmp_path / "state", env=env_vars)
    _refused(code, env, err, "invalid_contract", "$.repository.path", "symbolic link")

    # The contract's folder holds the config folder itself (no link anywhere).
    holder = _edit(
        write_contract(tmp_path, image_id, command=["true"]),
        lambda d: d["repository"].update(path="conf/runner-key"),
    )
    code, env, err = run_job(holder, tmp_path / "state", env=env_vars)
    _refused(code, env, err, "invalid_contract", "runner's own folders")

    inside = config / "job"
    inside.mkdir()
    in_config = write_contract(inside, image_id, command=["true"])
    code, env, err = run_job(in_config, tmp_path / "state", env=env_vars)
    _refused(code, env, err, "invalid_contract", "inside the runner's own folder")
    assert not [p for p in (tmp_path / "state").rglob("runner.key") if p.is_file()]
    record("runner keys never staged", "runc", env, held=True)


# --------------------------------------------------------------------- 2. tiny caps


@pytest.mark.parametrize(
    ("environment", "extra", "where"),
    [
        ({"memoryGb": 1e-10}, (), "$.environment.memoryGb"),
        ({"cpus": 1e-10}, (), "$.environment.cpus"),
        ({"shmGb": 0}, (), "$.environment.shmGb"),
        ({"diskGb": 1e-10}, (), "$.environment.diskGb"),
        ({}, ("--limit", "pidsLimit=0.5"), "--limit pidsLimit"),
        ({}, ("--limit", "tmpfsMb=0.5"), "--limit tmpfsMb"),
        ({}, ("--limit", "memoryGb=0.000001"), "--limit memoryGb"),
    ],
)
def test_caps_too_small_to_apply_are_refused(
    tmp_path: Path, image_id: str, environment: dict[str, Any], extra: tuple[str, ...], where: str
) -> None:
    """Values that would reach the engine as 0 (which it reads as "no cap") are refused with
    the field, never applied."""
    contract = write_contract(tmp_path, image_id, environment=environment)
    code, env, err = run_job(contract, tmp_path / "state", *extra)
    _refused(code, env, err, "policy_violation", where, "no cap")
    record(f"cap too small: {where}", "runc", env, held=True)


def test_applied_caps_are_exact_on_the_running_container(tmp_path: Path, image_id: str) -> None:
    """`docker inspect` of the running job shows every cap as the plan rounded it (down,
    never to 0), and the engine's own deadline (the backstop health check)."""
    contract = write_contract(
        tmp_path,
        image_id,
        command=["sleep", "60"],
        environment={
            "cpus": 0.0512345,
            "memoryGb": 0.03125,
            "shmGb": 0.001,
            "pidsLimit": 16,
            "tmpfsMb": 1,
            "timeoutMinutes": 1,
        },
    )
    proc = start_job(contract, tmp_path / "state")
    try:
        wait_running(proc)
        (cid,) = running_containers()
        inspected = json.loads(docker("inspect", cid).stdout)[0]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    host = inspected["HostConfig"]
    assert host["NanoCpus"] == 51_234_500
    assert host["Memory"] == host["MemorySwap"] == 32 * MIB
    assert host["ShmSize"] == int(0.001 * GIB)
    assert host["PidsLimit"] == 16
    assert host["Tmpfs"]["/tmp"].endswith(f"size={MIB}")
    health = inspected["Config"]["Healthcheck"]
    assert "kill -s KILL -- -1" in health["Test"][1]
    assert health["Interval"] == 6 * 10**9  # a tenth of the 60 s budget
    env = json.loads(out)
    assert env["failure"]["category"] == "cancelled", err
    assert env["limits"]["memoryBytes"] == 32 * MIB and env["limits"]["cpus"] == 0.0512345
    record("caps exact on the running container", "runc", env, held=True, inspected=host)


# --------------------------------------------------------------------- 3. hangs


def test_fifo_in_inputs_is_refused_without_hanging(tmp_path: Path, image_id: str) -> None:
    contract = write_contract(tmp_path, image_id)
    os.mkfifo(tmp_path / "repository" / "pipe")
    t0 = time.monotonic()
    code, env, err = run_job(contract, tmp_path / "state")
    _refused(code, env, err, "invalid_contract", "$.repository.path", "a FIFO")
    assert time.monotonic() - t0 < 60
    record("FIFO in the inputs", "runc", env, held=True)


STDERR_FIFO = r"""
import os, sys
path = os.environ["RUNNER_STDERR"]
os.remove(path)
os.mkfifo(path)
sys.exit(3)
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_stderr_replaced_by_a_fifo(tmp_path: Path, image_id: str, runtime: str) -> None:
    """A job that swaps its stderr file for a FIFO and exits 3 gets its envelope (the reason
    reader and the hashing refuse the FIFO without blocking), and so does a rerun."""
    contract = write_contract(tmp_path, image_id, command=py(STDERR_FIFO))
    code, env, err, peak = measured_run(contract, tmp_path / "state", runtime)
    assert code == 1, (env, err)
    assert env["failure"]["category"] == "nonzero_exit"
    stderr_log = next(log for log in env["logs"] if log["path"] == env["stderrPath"])
    assert stderr_log["exists"] is False
    # gVisor keeps a FIFO made on a bind mount inside its sandbox: the host sees none.
    assert "FIFO" in stderr_log["problem"] or runtime == "runsc"
    again, env2, err2, _ = measured_run(contract, tmp_path / "state", runtime)
    assert again == 1 and env2["failure"]["category"] == "nonzero_exit", err2
    record("stderr replaced by a FIFO", runtime, env, held=True, runnerPeakRss=peak)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_contract_path_that_is_a_fifo_or_a_device(tmp_path: Path, kind: str) -> None:
    """`runner verify` / `runner run` of a FIFO or /dev/zero-like contract path answers at
    once (exit 3) instead of blocking or reading without end."""
    path = tmp_path / "task.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 5))
    proc = run_cli("verify", str(path), timeout=30)
    assert proc.returncode == 3, proc.stderr
    assert "not a regular file" in proc.stderr


# --------------------------------------------------------------------- 4. inputs


def test_device_node_in_inputs_is_refused(tmp_path: Path, image_id: str) -> None:
    contract = write_contract(tmp_path, image_id)
    os.mknod(tmp_path / "repository" / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))
    code, env, err = run_job(contract, tmp_path / "state")
    _refused(code, env, err, "invalid_contract", "character device")
    record("device node in the inputs", "runc", env, held=True)


LINK_PROBE = r"""
import json, os
r = "/job/input/repository/"
out = {"shadow": os.readlink(r + "shadow"), "secret": os.readlink(r + "secret")}
linked, own = os.stat(r + "shadow"), os.stat("/etc/shadow")
out["containersShadow"] = int((linked.st_dev, linked.st_ino) == (own.st_dev, own.st_ino))
out["secretResolves"] = int(os.path.exists(r + "secret"))
json.dump(out, open("/job/output/probe.json", "w"))
"""


def test_links_below_an_input_are_staged_as_links_never_read(tmp_path: Path, image_id: str) -> None:
    """Links below the repository to /etc/shadow and to a secret file of the host are staged
    as links: their target text is copied, their targets never read (the manifest has the
    hash of the text only, and no staged file holds the secret); inside the container they
    resolve in the container's own filesystem, where the host's secret is not."""
    secret = tmp_path / "host-secret.txt"
    token = f"host secret {os.urandom(8).hex()}".encode()
    secret.write_bytes(token)
    contract = write_contract(
        tmp_path,
        image_id,
        command=py(LINK_PROBE),
        measurements=[json_measurement("probe.json", "/containersShadow", metric="same")],
    )
    os.symlink("/etc/shadow", tmp_path / "repository" / "shadow")
    os.symlink(str(secret), tmp_path / "repository" / "secret")
    code, env, err = run_job(contract, tmp_path / "state")
    assert code == 0, (env, err)
    job = Path(env["jobDir"])
    staged = job / "input" / "repository"
    assert os.readlink(staged / "shadow") == "/etc/shadow"
    assert os.readlink(staged / "secret") == str(secret)
    manifest = json.loads((job / "execution" / "input-manifest.json").read_text())
    links = {f["path"]: f for f in manifest["files"] if f.get("link")}
    assert links["repository/shadow"]["sha256"] == hashlib.sha256(b"/etc/shadow").hexdigest()
    assert links["repository/shadow"]["size"] == len("/etc/shadow")
    assert links["repository/secret"]["sha256"] == hashlib.sha256(bytes(secret)).hexdigest()
    host_shadow = Path("/etc/shadow").read_bytes() if os.access("/etc/shadow", os.R_OK) else None
    for path in (job / "input").rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            assert token not in data and (host_shadow is None or data != host_shadow), path
    probe = json.loads((job / "output" / "probe.json").read_text())
    assert probe == {
        "shadow": "/etc/shadow",
        "secret": str(secret),
        "containersShadow": 1,
        "secretResolves": 0,
    }
    assert env["inputsUnchanged"] is True
    record("links below an input staged as links", "runc", env, held=True)


def test_sparse_input_stays_sparse(tmp_path: Path, image_id: str) -> None:
    """A 3 GiB sparse input is staged as a sparse file (hashed in full), not 3 GiB of disk."""
    contract = write_contract(tmp_path, image_id)
    with open(tmp_path / "repository" / "sparse.bin", "wb") as f:
        f.truncate(3 * GIB)
        f.seek(GIB)
        f.write(b"data in the middle")
    code, env, err = run_job(contract, tmp_path / "state")
    assert code == 0, (env, err)
    staged = Path(env["jobDir"]) / "input" / "repository" / "sparse.bin"
    assert staged.stat().st_size == 3 * GIB
    assert staged.stat().st_blocks * 512 < 16 * MIB
    manifest = json.loads((Path(env["jobDir"]) / "execution" / "input-manifest.json").read_text())
    entry = next(f for f in manifest["files"] if f["path"].endswith("sparse.bin"))
    assert entry["size"] == 3 * GIB
    record("sparse input", "runc", env, held=True, allocatedBytes=staged.stat().st_blocks * 512)


@pytest.mark.parametrize(
    ("policy", "word"), [({"maxInputMb": 1}, "maxInputMb"), ({"maxInputFiles": 3}, "maxInputFiles")]
)
def test_inputs_over_the_policy_caps_are_refused(
    tmp_path: Path, image_id: str, policy: dict[str, Any], word: str
) -> None:
    contract = write_contract(tmp_path, image_id)
    (tmp_path / "repository" / "blob.bin").write_bytes(os.urandom(2 * MIB))
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps(policy))
    code, env, err = run_job(contract, tmp_path / "state", "--policy", str(policy_file))
    _refused(code, env, err, "policy_violation", word)
    record(f"inputs over {word}", "runc", env, held=True)


# --------------------------------------------------------------------- 5. job output


BOMBS = r"""
import json, os
out = "/job/output"
with open(f"{out}/pad.json", "w") as f:
    f.write('{"pad": "' + "x" * (64 << 20) + '", "accuracy": 0.5}')
json.dump({"accuracy": 0.75}, open(f"{out}/good.json", "w"))
with open(f"{out}/big.bin", "wb") as f:
    f.truncate(32 << 30)
json.dump({"schemaVersion": "2.0", "status": "completed", "summary": "s",
           "outputs": [{"path": "big.bin"}, {"path": "good.json"}]},
          open(f"{out}/result.json", "w"))
"""


def test_long_token_and_huge_listed_output(tmp_path: Path, image_id: str) -> None:
    """A 64 MiB JSON string is refused as a parse error at once (not parsed quadratically),
    the other measurement survives (partial), and a 32 GiB sparse file listed in result.json
    is not hashed past the cap."""
    contract = write_contract(
        tmp_path,
        image_id,
        command=py(BOMBS),
        measurements=[
            json_measurement("pad.json", mid="pad"),
            json_measurement("good.json", mid="good"),
        ],
        environment={"memoryGb": 1},
    )
    t0 = time.monotonic()
    code, env, err, peak = measured_run(
        contract, tmp_path / "state", "runc", policy={"maxEvidenceMb": 256}
    )
    wall = time.monotonic() - t0
    assert code == 1 and env["status"] == "partial", (env, err)
    assert [m["value"] for m in env["measurements"]] == [0.75]
    (error,) = env["measurementErrors"]
    assert error["category"] == "parse_error" and "longer than" in error["reason"]
    listed = {f["path"]: f for f in env["agentResult"]["listed"]}
    assert listed["big.bin"]["sha256"] is None and "not hashed" in listed["big.bin"]["problem"]
    assert listed["good.json"]["sha256"] is not None
    assert peak < 200 * MIB
    record("64 MiB JSON token, 32 GiB listed output", "runc", env, held=True,
            runnerPeakRss=peak, wallSeconds=round(wall, 1))  # fmt: skip


@pytest.mark.parametrize(
    ("case", "writer", "problem"),
    [
        ("nested", "f.write('[' * 100000)", "nested too deeply"),
        ("2 GiB", "f.truncate(2 << 30)", "over the"),
    ],
)
def test_hostile_result_json(
    tmp_path: Path, image_id: str, case: str, writer: str, problem: str
) -> None:
    """A deeply nested or 2 GiB result.json is a recorded problem, never a runner failure;
    the measurement survives and the envelope stays small."""
    job = (
        "import json\n"
        "json.dump({'accuracy': 0.5}, open('/job/output/m.json', 'w'))\n"
        f"with open('/job/output/result.json', 'w') as f:\n    {writer}\n"
    )
    contract = write_contract(
        tmp_path, image_id, command=py(job), measurements=[json_measurement("m.json", mid="m")]
    )
    code, env, err, peak = measured_run(contract, tmp_path / "state", "runc")
    assert code == 0 and env["status"] == "succeeded", (env, err)
    assert env["measurements"][0]["value"] == 0.5
    assert env["agentResult"]["valid"] is False
    assert any(problem in p for p in env["agentResult"]["problems"]), env["agentResult"]
    assert len(json.dumps(env)) < 64 * 1024
    assert peak < 200 * MIB
    record(f"result.json: {case}", "runc", env, held=True, runnerPeakRss=peak)


# --------------------------------------------------------------------- 6. logs


SWAP_LOG_FOLDER = r"""
import os, sys
sys.stdout.write("y" * 300000)
sys.stdout.flush()
os.rename("/job/output/x", "/job/output/x.orig")
os.symlink("/etc", "/job/output/x")
sys.stdout.write("z" * 300000)
sys.stdout.flush()
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_log_folder_swapped_for_a_link(tmp_path: Path, image_id: str, runtime: str) -> None:
    """stdoutPath x/shadow, and the job swaps folder x for a link to /etc: the envelope
    carries no hash of the host's /etc/shadow and the log cap never touches it."""
    shadow = Path("/etc/shadow")
    before = (shadow.read_bytes(), shadow.stat().st_mtime_ns)
    contract = write_contract(
        tmp_path,
        image_id,
        command=py(SWAP_LOG_FOLDER),
        protocol={"stdoutPath": "x/shadow"},
        environment={"logLimitMb": 0.1},
    )
    code, env, err, peak = measured_run(contract, tmp_path / "state", runtime)
    assert env["exitCode"] == 0, (code, env, err)
    log = next(entry for entry in env["logs"] if entry["path"] == "x/shadow")
    assert log["exists"] is False and log["sha256"] is None
    assert "link" in log["problem"]
    assert (shadow.read_bytes(), shadow.stat().st_mtime_ns) == before
    record("log folder swapped for a link", runtime, env, held=True, runnerPeakRss=peak)


def test_log_folder_link_left_for_the_next_attempt(tmp_path: Path, image_id: str) -> None:
    """A job leaves output/logs as a link to a host folder; preparing the next attempt
    (--rerun) creates its log folders without going through it."""
    host_folder = tmp_path / "host-folder"
    host_folder.mkdir()
    plant = (
        "import os, shutil\n"
        "shutil.rmtree('/job/output/logs')\n"
        f"os.symlink({str(host_folder)!r}, '/job/output/logs')\n"
    )
    contract = write_contract(
        tmp_path,
        image_id,
        command=py(plant),
        protocol={"stdoutPath": "logs/sub/out.log", "stderrPath": "logs/sub/err.log"},
    )
    state = tmp_path / "state"
    code, env, err = run_job(contract, state)
    assert env["exitCode"] == 0, (code, env, err)
    code, env, err = run_job(contract, state, "--rerun")
    assert env["budget"]["attempts"] == 2, (code, env, err)
    assert list(host_folder.iterdir()) == []
    record("log folder link left for the next attempt", "runc", env, held=True)


# --------------------------------------------------------------------- 7. fragments


def test_required_fragment_inside_a_shell_comment(tmp_path: Path, image_id: str) -> None:
    contract = write_contract(
        tmp_path,
        image_id,
        command=["sh", "-c", "python3 /job/input/repository/evaluate.py # --checkpoint"],
        protocol={"requiredCommandFragments": ["evaluate.py", "--checkpoint"]},
    )
    code, env, err = run_job(contract, tmp_path / "state")
    _refused(code, env, err, "protocol_ambiguous", "'--checkpoint'")
    record("fragment inside a shell comment", "runc", env, held=True)


# --------------------------------------------------------------------- 8. budget replay


def test_signed_contract_budget_is_not_replayed(tmp_path: Path, image_id: str) -> None:
    """A signed contract without a jobId keeps one budget: another --job-id is refused, and
    --rerun after it expired starts nothing (its stored envelope still shows)."""
    contract = write_contract(tmp_path, image_id)
    envelope, keys = _sign(tmp_path, contract, expires="12s")
    state = tmp_path / "state"
    trusted = ("--trusted-keys", str(keys))
    code, env, err = run_job(envelope, state, *trusted, "--job-id", "again-1", unsigned=False)
    _refused(code, env, err, "policy_violation", "--job-id", "fresh budget")
    code, env, err = run_job(envelope, state, *trusted, unsigned=False)
    assert code == 0, (env, err)
    expires = json.loads(base64.b64decode(json.loads(envelope.read_text())["payload"]))["expiresAt"]
    time.sleep(max((datetime.fromisoformat(expires) - datetime.now(UTC)).total_seconds(), 0) + 1)
    code, env, err = run_job(envelope, state, *trusted, "--rerun", unsigned=False)
    _refused(code, env, err, "policy_violation", "$.expiresAt", "no new attempt")
    code, again, err = run_job(envelope, state, *trusted, unsigned=False)
    assert code == 0 and again["status"] == "succeeded", (again, err)
    record("signed budget replay", "runc", env, held=True)


# --------------------------------------------------------------------- 9. runner down


OVERRUN = r"""
import time
time.sleep(1.5)  # the runner is killed meanwhile
chunk = b"x" * (1 << 20)
with open("/job/workspace/fill.bin", "wb") as f:
    for _ in range(64):
        f.write(chunk)
time.sleep(120)
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_runner_killed_job_overruns(tmp_path: Path, image_id: str, runtime: str) -> None:
    """With the runner killed, the engine's own deadline ends the job near its budget (not
    at its 120 s), and the next run classifies what happened first: the disk quota."""
    contract = write_contract(
        tmp_path,
        image_id,
        command=py(OVERRUN),
        environment={"diskGb": 16 / 1024, "timeoutMinutes": 4 / 60, "isolation": runtime},
    )
    state = tmp_path / "state"
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({"isolation": runtime}))
    proc = start_job(contract, state, "--policy", str(policy_file), "--stop-grace", "1")
    wait_running(proc)
    t0 = time.monotonic()
    proc.kill()
    proc.communicate(timeout=30)
    ledger = next((state / "jobs").iterdir()) / "record" / "ledger.jsonl"
    events = [json.loads(line) for line in ledger.read_text().splitlines()]
    name = next(e["data"]["containerName"] for e in events if e["type"] == "attempt.starting")
    while json.loads(docker("inspect", name).stdout)[0]["State"]["Running"]:
        assert time.monotonic() - t0 < 60, "the engine did not end the job"
        time.sleep(0.5)
    ended = time.monotonic() - t0
    st = json.loads(docker("inspect", name).stdout)[0]["State"]
    assert st["ExitCode"] == 137
    # budget 4 s + grace 1 s + 2 s, checked every second
    assert ended < 4 + 1 + 2 + 1 + 5
    code, env, err = run_job(contract, state, "--policy", str(policy_file))
    assert code == 1, (env, err)
    assert env["failure"]["category"] == "disk_quota_exceeded", env["failure"]
    assert env["budget"]["consumedSeconds"] >= 4
    record("runner killed, job overruns", runtime, env, held=True,
            wallSeconds=round(ended, 1))  # fmt: skip


def test_runner_killed_job_sleeps_past_its_budget(tmp_path: Path, image_id: str) -> None:
    contract = write_contract(
        tmp_path, image_id, command=["sleep", "120"], environment={"timeoutMinutes": 3 / 60}
    )
    state = tmp_path / "state"
    proc = start_job(contract, state, "--stop-grace", "1")
    wait_running(proc)
    proc.kill()
    proc.communicate(timeout=30)
    time.sleep(10)  # budget 3 s + grace 1 s + 2 s + a 1 s check interval
    code, env, err = run_job(contract, state)
    assert code == 1, (env, err)
    assert env["failure"]["category"] == "timeout", env["failure"]
    assert env["container"]["oomKilled"] is False
    record("runner killed, job sleeps past its budget", "runc", env, held=True)


# --------------------------------------------------------------------- 10. names


@pytest.mark.parametrize("bad", ["logs/out\n.log", "logs/\x1b[31mred", "logs/tab\there"])
def test_control_characters_in_names_are_refused(tmp_path: Path, image_id: str, bad: str) -> None:
    contract = write_contract(tmp_path, image_id, protocol={"stdoutPath": bad})
    code, env, err = run_job(contract, tmp_path / "state")
    _refused(code, env, err, "invalid_contract", "$.protocol.stdoutPath", "control characters")
    record("control characters in a name", "runc", env, held=True)


def test_slurm_batch_script_never_runs_a_path_as_shell(tmp_path: Path) -> None:
    """A state folder or contract path with `…` and $(…) in it (a review found the batch
    script's messages ran them as commands): the script prints the paths as they are and runs
    nothing of them."""
    import subprocess

    from runner.scheduling.slurm import batch

    class _Request:
        contract = str(tmp_path / "c`touch pwned1`" / "t.json")
        jobId = "hostile-paths"
        contractSha256 = "ab" * 32

    state = tmp_path / "st$(touch pwned2)"
    script = tmp_path / "batch.sh"
    marker, token = state / "marker", "submit-token"
    text = batch.batch_script(
        _Request(),  # type: ignore[arg-type]
        python="/bin/false",
        state=state,
        marker=marker,
        token=token,
        run_args=[],
    )
    script.write_text(text)
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "1"}

    def batch() -> subprocess.CompletedProcess[str]:
        argv = ["sh", str(script)]
        return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=env)

    done = batch()
    assert done.returncode == 97, done.stderr
    assert str(state) in done.stderr, "the path shown as it is"
    assert not list(tmp_path.glob("pwned*")), "nothing of a path ran"
    state.mkdir()
    marker.write_text(token)
    again = batch()
    assert again.returncode == 98 and _Request.contract in again.stderr, again.stderr
    assert not list(tmp_path.glob("pwned*"))
