"""Long on purpose: every test of the Podman backend in one place, from the pure decision to
real rootful and rootless Podman, so that what runs under Podman is read in one file.

The Podman backend: which caps it can enforce (pure logic, every combination of rootless or
rootful, cgroup v1 or v2, delegated controllers), the engine a host picks, and real Podman:
the toy and the hostile suite's core cases under rootful Podman, and `runner run` as an
unprivileged user with rootless Podman, refused on cgroup v1 with the cap named and nothing
created (run on cgroup v2, the same test expects the toy to succeed instead).

``scripts/setup_podman.sh`` prepares what these need (Podman, its rootful API service, the job
image in its store, the user ``runner-rootless``); anything missing fails, never skips.

The tests that need no engine are in tests/unit/test_podman.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import tests.integration.test_hostile as hostile
import tests.integration.test_images as image_tests
import tests.integration.test_restarts as restarts
from runner.backends.base import ContainerSpec
from runner.backends.podman import PodmanBackend
from runner.backends.podmancaps import PodmanHost, refusal
from runner.backends.types import MIB
from tests.support import (
    ROOT,
    SESSION_ID,
    SESSION_LABEL,
    copy_toy_inputs,
    run_cli,
    run_job,
    write_contract,
)
from tests.unit.test_podman import (
    _limits,
)

local_registry = image_tests.local_registry
pushed = image_tests.pushed

TEST_USER = "runner-rootless"
ROOTFUL = "unix:///run/podman/podman.sock"


# ------------------------------------------------------------------ real rootful Podman


def _podman(*args: str, user: str | None = None, env: dict[str, str] | None = None) -> str:
    prefix = ["runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in (env or {}).items())]
    proc = subprocess.run(
        [*(prefix if user else []), "podman", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, (args, proc.stderr)
    return proc.stdout


def _created_since(since: str) -> list[str]:
    """Names of the containers of this test session rootful Podman created since ``since``."""
    out = _podman(
        "events", "--stream=false", "--since", since, "--filter", "event=create",
        "--format", "json",
    )  # fmt: skip
    names = []
    for line in out.splitlines():
        event = json.loads(line)
        if (event.get("Attributes") or {}).get(SESSION_LABEL) == SESSION_ID:
            names.append(str(event.get("Name")))
    return names


@pytest.fixture(scope="module")
def rootful(image_id: str) -> Iterator[PodmanBackend]:
    """The rootful API service, with the job image under the id Docker gives it."""
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: run scripts/setup.sh (scripts/setup_podman.sh)")
    backend = PodmanBackend(ROOTFUL)
    backend.ping()
    info = backend.inspect_image(image_id)
    assert info is not None, f"{image_id} is not in Podman's store: run scripts/setup_podman.sh"
    assert info.id == image_id  # one image id under both engines
    assert not any(d.startswith("localhost/") for d in info.repo_digests)
    yield backend
    left = _podman("ps", "-aq", "--filter", f"label={SESSION_LABEL}={SESSION_ID}").split()
    if left:
        _podman("rm", "-f", *left)
        pytest.fail(f"Podman containers left behind by the runner: {left}")


@pytest.fixture
def podman_engine(monkeypatch: pytest.MonkeyPatch, rootful: PodmanBackend) -> Iterator[str]:
    """Every `runner run` of the test goes to rootful Podman (RUNNER_ENGINE, with the
    policy's engine left at auto); yields when the test began, for Podman's events."""
    monkeypatch.setenv("RUNNER_ENGINE", "podman")
    monkeypatch.setenv("CONTAINER_HOST", ROOTFUL)
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))
    yield since
    assert _created_since(since), "no container of the test was created by Podman"


@pytest.mark.docker
@pytest.mark.podman
def test_toy_runs_under_rootful_podman(
    tmp_path: Path, image_id: str, rootful: PodmanBackend
) -> None:
    """The policy's engine picks Podman; the toy gives 0.819 with every cap in force."""
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))
    contract = write_contract(tmp_path, image_id)
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({"engine": "podman"}))
    code, env, err = run_job(
        contract, tmp_path / "state", "--policy", str(policy_file), env={"CONTAINER_HOST": ROOTFUL}
    )
    assert code == 0, (env, err)
    assert env["status"] == "succeeded"
    assert env["measurements"][0]["value"] == 0.819
    assert env["image"]["id"] == image_id
    assert env["container"]["name"] in _created_since(since)
    server = _podman("version", "--format", "{{.Version}}").strip()  # local: no Server part
    assert env["engine"]["name"] == "podman" and env["engine"]["version"] == server


@pytest.mark.docker
@pytest.mark.podman
@pytest.mark.parametrize(
    "case",
    [
        "test_fork_bomb",
        "test_memory_bomb",
        "test_disk_filler",
        "test_escalation_and_host_access",
        "test_network_egress",
    ],
)
def test_hostile_core_under_rootful_podman(
    case: str, tmp_path: Path, image_id: str, podman_engine: str
) -> None:
    """The hostile suite's own cases, unchanged, with Podman as the engine: the pids cap
    holds (forks fail), the memory bomb ends as oom, workspace/ past diskGb is stopped, the
    root, input and execution folders refuse writes, and nothing outside is reachable."""
    getattr(hostile, case)(tmp_path, image_id, "runc")


@pytest.mark.docker
@pytest.mark.podman
def test_a_bundle_loads_into_podman_under_the_id_docker_gives_it(
    tmp_path: Path, rootful: PodmanBackend
) -> None:
    """`runner image load` with Podman as the engine: the bundle's ids are checked before,
    and the image Podman then holds has the same id (config digest) as under Docker."""
    tag = "runner-gpu-smoke:local"  # small, and in no test's way
    proc = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, f"{tag} is missing: run scripts/setup.sh"
    image_id = proc.stdout.strip()
    bundle = tmp_path / "bundle.tar"
    subprocess.run(["docker", "save", tag, "-o", str(bundle)], check=True)
    subprocess.run(["podman", "rmi", "-f", "--ignore", image_id], check=True, capture_output=True)
    assert rootful.inspect_image(image_id) is None
    try:
        wrong = run_cli("image", "load", str(bundle), "--expect", "sha256:" + "0" * 64,
                        env={"RUNNER_ENGINE": "podman", "CONTAINER_HOST": ROOTFUL})  # fmt: skip
        assert wrong.returncode == 3, wrong.stderr
        assert rootful.inspect_image(image_id) is None
        got = run_cli("image", "load", str(bundle), "--expect", image_id,
                      env={"RUNNER_ENGINE": "podman", "CONTAINER_HOST": ROOTFUL})  # fmt: skip
        assert got.returncode == 0, got.stderr
        info = rootful.inspect_image(image_id)
        assert info is not None and info.id == image_id
        assert info.repo_tags == (tag,) and info.repo_digests == ()
    finally:
        subprocess.run(["podman", "rmi", "-f", "--ignore", image_id], check=False,
                       capture_output=True)  # fmt: skip


@pytest.mark.docker
@pytest.mark.podman
def test_a_digest_pin_is_pulled_into_podman_and_verified(
    tmp_path: Path, pushed: tuple[str, str, str], rootful: PodmanBackend
) -> None:
    """A `name@sha256` pin missing from Podman's store is pulled through Podman from the
    loopback registry, its repo digest and image id checked as under Docker, and run."""
    repo, digest, unique_id = pushed
    subprocess.run(["podman", "rmi", "-f", "--ignore", unique_id], check=True, capture_output=True)
    contract = write_contract(tmp_path, f"{repo}@{digest}", environment={"imageId": unique_id})
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({"engine": "podman"}))
    try:
        code, env, err = run_job(contract, tmp_path / "state", "--policy", str(policy_file),
                                 env={"CONTAINER_HOST": ROOTFUL})  # fmt: skip
        assert code == 0, (env, err)
        assert env["measurements"][0]["value"] == 0.819
        assert env["image"]["source"] == "pulled"
        assert env["image"]["id"] == unique_id
        assert env["image"]["repoDigest"] == f"{repo}@{digest}"
    finally:
        subprocess.run(["podman", "rmi", "-f", "--ignore", unique_id], check=False,
                       capture_output=True)  # fmt: skip


def _podman_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``docker``'s stand-in for the restart tests: the same arguments, to Podman."""
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=False)


@pytest.mark.docker
@pytest.mark.podman
@pytest.mark.parametrize(
    "case",
    [
        "test_kill9_mid_run_reattaches_to_the_one_container",
        "test_container_that_ended_while_the_runner_was_dead",
        "test_repeated_kills_add_up_to_one_budget",
    ],
)
def test_restarts_under_rootful_podman(
    case: str,
    tmp_path: Path,
    image_id: str,
    podman_engine: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The restart suite's own cases with Podman as the engine (their container listings
    asked of Podman): kill -9 the runner and it reattaches to the one container, records an
    end it missed, and repeated kills never buy time beyond the one budget."""
    monkeypatch.setattr(restarts, "docker", _podman_cli)
    getattr(restarts, case)(tmp_path, image_id)


@pytest.mark.docker
@pytest.mark.podman
def test_the_engine_ends_a_job_whose_runner_died_at_its_deadline(
    tmp_path: Path, image_id: str, podman_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backstop without any runner: conmon kills the job at the engine's deadline (the
    budget, the stop grace and 2 s; a health check would need systemd here), and the next
    `runner run` records the end as a timeout."""
    monkeypatch.setattr(restarts, "docker", _podman_cli)
    budget = 4.0
    contract = restarts._contract(tmp_path, image_id, sleep=60, budget_s=budget)
    state = tmp_path / "state"
    proc = restarts._start(contract, state, "--stop-grace", "1")
    restarts._wait_for(state, "attempt.started")
    (cid,) = restarts._containers(restarts._job_id(state))
    restarts._wait_started(cid)
    started = time.monotonic()
    restarts._kill9(proc)
    # what runner.execution.container.backstop gives: ceil(budget + grace) + 2
    deadline = budget + 1 + 2
    status = ""
    while time.monotonic() - started < deadline + 15:
        status = json.loads(_podman("inspect", cid))[0]["State"]["Status"]
        if status != "running":
            break
        time.sleep(0.5)
    # "stopped": its process has ended and conmon's clean-up has not run yet (under load).
    assert status in {"exited", "stopped"}, "the engine did not end the job at its deadline"
    code, env, err = restarts._finish(restarts._start(contract, state))
    assert code == 1, err
    assert env["failure"]["category"] == "timeout"
    ran = restarts._true_running_time(state)
    assert deadline - 1 <= ran <= deadline + 2, ran
    assert restarts._containers(restarts._job_id(state)) == []


# ------------------------------------------------------------------ real rootless Podman


def _user_python() -> list[str]:
    """An interpreter the unprivileged user may run, with the runner and its dependencies
    (the venv's own interpreter may live in root's home)."""
    site = next(Path(sys.prefix, "lib").glob("python3*/site-packages"))
    system = Path("/usr/bin/python3")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    out = subprocess.run([str(system), "-c", "import sys; print(sys.version[:4])"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    if not out.stdout.startswith(version):
        pytest.fail(f"/usr/bin/python3 is not Python {version} (the venv's): {out.stdout!r}")
    return [str(system), f"PYTHONPATH={ROOT}:{site}"]


@pytest.fixture
def rootless_dir() -> Iterator[Path]:
    """A folder the unprivileged user owns (pytest's tmp_path is root's alone)."""
    try:
        uid = int(subprocess.run(["id", "-u", TEST_USER], capture_output=True, text=True,
                                 check=True).stdout)  # fmt: skip
    except subprocess.CalledProcessError:
        pytest.fail(f"the user {TEST_USER} is missing: run scripts/setup_podman.sh")
    folder = Path(tempfile.mkdtemp(prefix="runner-rootless-"))
    folder.chmod(0o755)
    os.chown(folder, uid, uid)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.docker
@pytest.mark.podman
def test_rootless_podman_refuses_caps_it_cannot_enforce(rootless_dir: Path, image_id: str) -> None:
    """`runner run` as an unprivileged user, the policy choosing Podman, the user's own
    rootless API service: on cgroup v1 exit 3, policy_violation naming the memory cap, and
    no container; on cgroup v2 with the controllers delegated, the toy's 0.819."""
    runtime = rootless_dir / "run"
    sock = runtime / "podman.sock"
    user_env = {"HOME": f"/home/{TEST_USER}", "XDG_RUNTIME_DIR": str(runtime)}
    subprocess.run(["runuser", "-u", TEST_USER, "--", "mkdir", "-m", "700", str(runtime)],
                   check=True)  # fmt: skip
    service = subprocess.Popen(
        ["runuser", "-u", TEST_USER, "--", "env", *(f"{k}={v}" for k, v in user_env.items()),
         "podman", "system", "service", "--time=0", f"unix://{sock}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert service.poll() is None, service.communicate()
            assert time.monotonic() < deadline, "the rootless API service did not start"
            time.sleep(0.2)
        info = json.loads(_podman("info", "--format", "json", user=TEST_USER, env=user_env))
        host = PodmanHost.from_info(info)
        assert host.rootless
        if refusal(_limits(), host) is None:  # it will run: the image into the user's store
            bundle = rootless_dir / "image.tar"
            subprocess.run(["docker", "save", image_id, "-o", str(bundle)], check=True)
            bundle.chmod(0o644)
            _podman("load", "-q", "-i", str(bundle), user=TEST_USER, env=user_env)
        job = rootless_dir / "job"
        job.mkdir()
        copy_toy_inputs(job)
        contract = write_contract(job, image_id)
        (job / "policy.json").write_text(json.dumps({"engine": "podman"}))
        subprocess.run(["chown", "-R", TEST_USER, str(job)], check=True)
        python, path = _user_python()
        proc = subprocess.run(
            ["runuser", "-u", TEST_USER, "--", "env", "-i", "PATH=/usr/bin:/bin", path,
             *(f"{k}={v}" for k, v in user_env.items()),
             f"RUNNER_CONFIG_DIR={job / 'config'}", f"CONTAINER_HOST=unix://{sock}",
             python, "-m", "runner", "run", str(contract), "--state-dir", str(job / "state"),
             "--policy", str(job / "policy.json"), "--allow-unsigned", "--json",
             "--label", f"{SESSION_LABEL}={SESSION_ID}"],
            capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        env = json.loads(proc.stdout)
        if refusal(_limits(), host) is None:  # cgroup v2, delegated: the rootless happy path
            assert proc.returncode == 0, (env, proc.stderr)
            assert env["measurements"][0]["value"] == 0.819
            return
        assert proc.returncode == 3, (env, proc.stderr)
        failure = env["failure"]
        assert failure["category"] == "policy_violation"
        assert failure["stage"] == "plan"
        assert f"rootless Podman on cgroup {host.cgroup_version} cannot enforce the memory cap " \
            "(memory: 512 MiB)" in failure["reason"]  # fmt: skip
        left = _podman("ps", "-aq", user=TEST_USER, env=user_env).split()
        assert left == [], left
        assert not (job / "state" / "jobs").exists()
    finally:
        service.terminate()
        service.wait(timeout=30)


@pytest.mark.podman
def test_rootless_podman_create_checks_the_container_it_made(rootless_dir: Path) -> None:
    """The second line: should the first check ever be skipped, ``create`` reads the created
    container back; rootless Podman on cgroup v1 made it without the caps, so it is removed
    and refused."""
    user_env = {"HOME": f"/home/{TEST_USER}", "XDG_RUNTIME_DIR": str(rootless_dir)}
    tiny = rootless_dir / "tiny"
    subprocess.run(["runuser", "-u", TEST_USER, "--", "sh", "-c",
                    f"mkdir {tiny} && echo x > {tiny}/f && tar -C {tiny} -cf {tiny}.tar ."],
                   check=True)  # fmt: skip
    name = f"runner-tiny-{uuid.uuid4().hex[:8]}"
    image = _podman("import", "-q", f"{tiny}.tar", f"{name}:1", user=TEST_USER, env=user_env)
    script = f"""
import json, sys
from pathlib import Path
from runner.backends.base import ContainerSpec
from runner.backends.podman import PodmanBackend
from runner.backends.types import Limits
from runner.core.errors import PolicyViolation
b = PodmanBackend(sys.argv[1])
b.check_limits = lambda limits: None  # the first line skipped
lim = Limits(cpus=1.0, memory_bytes=2**28, memory_swap_bytes=2**28, shm_bytes=2**26, pids=64,
             tmpfs_bytes=2**26, gpus="none", network="none", timeout_seconds=60)
spec = ContainerSpec(name="{name}", image="{image.strip()}", entrypoint=["/bin/sh"],
                     command=["-c", "true"], user="10001:10001", working_dir="/",
                     environment={{}}, labels={{}}, mounts=[], limits=lim)
try:
    b.create(spec)
    print("created")
except PolicyViolation as exc:
    print(exc.message)
"""
    python, path = _user_python()
    runtime = rootless_dir / "run"
    subprocess.run(["runuser", "-u", TEST_USER, "--", "mkdir", "-m", "700", str(runtime)],
                   check=True)  # fmt: skip
    service = subprocess.Popen(
        ["runuser", "-u", TEST_USER, "--", "env", "HOME=" + user_env["HOME"],
         f"XDG_RUNTIME_DIR={runtime}", "podman", "system", "service", "--time=0",
         f"unix://{runtime}/podman.sock"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (runtime / "podman.sock").exists():
            assert time.monotonic() < deadline, "the rootless API service did not start"
            time.sleep(0.2)
        info = json.loads(_podman("info", "--format", "json", user=TEST_USER, env=user_env))
        host = PodmanHost.from_info(info)
        out = subprocess.run(
            ["runuser", "-u", TEST_USER, "--", "env", "-i", "PATH=/usr/bin:/bin", path,
             f"HOME={user_env['HOME']}", f"XDG_RUNTIME_DIR={runtime}",
             python, "-c", script, f"unix://{runtime}/podman.sock"],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        if refusal(_limits(), host) is None:
            assert out.stdout.strip() == "created"
        else:
            assert "Podman created the container with Memory 0, not 268435456" in out.stdout
            left = _podman("ps", "-aq", "--filter", f"name={name}", user=TEST_USER, env=user_env)
            assert left.split() == []
    finally:
        service.terminate()
        service.wait(timeout=30)
        _podman("rm", "-f", "--ignore", name, user=TEST_USER, env=user_env)
        _podman("rmi", "-f", f"{name}:1", user=TEST_USER, env=user_env)


@pytest.mark.docker
@pytest.mark.podman
def test_podman_containers_carry_the_caps_and_labels(rootful: PodmanBackend, image_id: str) -> None:
    """What rootful Podman was given is what it holds: the caps, the labels, no network, a
    read-only root; and a container removed twice is not an error."""
    name = f"runner-podman-caps-{uuid.uuid4().hex[:8]}"
    spec = ContainerSpec(
        name=name, image=image_id, entrypoint=["/bin/sh", "-c"], command=["exit 3"],
        user="10001:10001", working_dir="/", environment={},
        labels={SESSION_LABEL: SESSION_ID, "org.runner.test": name}, mounts=[],
        limits=_limits(memory_bytes=256 * MIB, memory_swap_bytes=256 * MIB, pids=64),
    )  # fmt: skip
    cid = rootful.create(spec)
    try:
        raw = json.loads(_podman("inspect", cid))[0]
        hc = raw["HostConfig"]
        assert (hc["Memory"], hc["MemorySwap"], hc["PidsLimit"]) == (256 * MIB, 256 * MIB, 64)
        assert (hc["NanoCpus"], hc["CpuQuota"], hc["CpuPeriod"]) == (2 * 10**9, 200_000, 100_000)
        assert hc["ShmSize"] == 64 * MIB and hc["Init"] is True
        assert hc["Tmpfs"] == {"/tmp": f"rw,nosuid,nodev,size={64 * MIB},rprivate,tmpcopyup"}
        assert hc["LogConfig"]["Type"] == "k8s-file"  # what "json-file" is to Podman
        assert hc["LogConfig"]["Size"] == "1.049MB"  # spec.log_max_bytes, 1 MiB, as it shows it
        assert hc["NetworkMode"] == "none" and hc["ReadonlyRootfs"] is True
        assert "no-new-privileges" in hc["SecurityOpt"]
        assert [c.id for c in rootful.find({"org.runner.test": name})] == [cid]
        rootful.start(cid)
        assert rootful.wait(cid, 60) == 3
        state = rootful.state(cid)
        assert (state.exit_code, state.oom_killed, state.running) == (3, False, False)
    finally:
        rootful.remove(cid)
        rootful.remove(cid)
    assert rootful.find({"org.runner.test": name}) == []
