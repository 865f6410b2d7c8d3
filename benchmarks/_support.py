"""What every figure shares: the run's session (its children, containers and temporary
folder, all removed on exit), the bench (contracts, the `runner run` and `docker run` argv,
one job each way), the statistics of a figure's samples and its row, interleaving, timers
and the machine's facts."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from runner.testing import IMAGE

ROOT = Path(__file__).resolve().parent.parent
INPROC = Path(__file__).resolve().parent / "inproc.py"
"""In-process measurements, each in an interpreter of its own (run by path)."""
MIB = 1024**2
GIB = 1024**3
X = "\N{MULTIPLICATION SIGN}"


class Session:
    """The run's id, temporary folder and live children; ``close`` removes all of them."""

    def __init__(self, workdir: Path | None, bytecode_cache: bool) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.tmp = Path(tempfile.mkdtemp(prefix=f"runner-bench-{self.id}-", dir=workdir))
        self.children: set[subprocess.Popen[bytes]] = set()
        self.lock = threading.Lock()
        # Unix socket paths must stay short (108 bytes), whatever --workdir is.
        self.sockets = Path(tempfile.mkdtemp(prefix=f"runner-bench-{self.id}-sock-"))
        self.config_dir = self.tmp / "config"
        self.config_dir.mkdir()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        self.env["RUNNER_CONFIG_DIR"] = str(self.config_dir)  # no host policy or keys leak in
        self.env["RUNNER_SERVER"] = "off"  # in-process, except in the rows that start a server
        self.env_as_given = dict(self.env)
        if bytecode_cache:
            # Steady state, as after `pip install` or any earlier run: bytecode is cached. Here
            # it goes to a temporary prefix, so nothing is written into the working tree.
            self.env.pop("PYTHONDONTWRITEBYTECODE", None)
            self.env["PYTHONPYCACHEPREFIX"] = str(self.tmp / "pycache")

    def spawn(self, argv: Sequence[str], **kw: Any) -> subprocess.Popen[bytes]:
        kw.setdefault("env", self.env)
        kw.setdefault("stdin", subprocess.DEVNULL)
        # Own session: Ctrl-C reaches only this script, which then stops its children in order.
        proc = subprocess.Popen(list(argv), start_new_session=True, **kw)
        with self.lock:
            self.children.add(proc)
        return proc

    def reap(self, proc: subprocess.Popen[bytes]) -> tuple[int, int]:
        """Wait for ``proc``; its exit code and peak RSS in bytes (from wait4)."""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        with self.lock:
            self.children.discard(proc)
        return proc.returncode, usage.ru_maxrss * 1024

    def containers(self) -> list[str]:
        out = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=bench={self.id}"],
            capture_output=True,
            text=True,
            check=False,
        )
        return out.stdout.split()

    def close(self) -> None:
        with self.lock:
            live = [p for p in self.children if p.poll() is None]
        for proc in live:  # runner: stops its container, writes `cancelled`; docker run: proxies
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        left = self.containers()
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True, check=False)
        nets = subprocess.run(  # the egress figure's, and any a runner job left
            ["docker", "network", "ls", "-q", "--filter", f"label=bench={self.id}"],
            capture_output=True, text=True, check=False,
        ).stdout.split()  # fmt: skip
        if nets:
            subprocess.run(["docker", "network", "rm", *nets], capture_output=True, check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)
        shutil.rmtree(self.sockets, ignore_errors=True)


def on_signal(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def summary(xs: Sequence[float]) -> dict[str, Any]:
    s = sorted(xs)
    q1, q3 = (statistics.quantiles(s, n=4, method="inclusive")[::2]) if len(s) > 1 else (s[0],) * 2
    return {
        "n": len(s),
        "median": statistics.median(s),
        "min": s[0],
        "max": s[-1],
        "q1": q1,
        "q3": q3,
        "samples": [round(x, 6) for x in xs],
    }


@dataclass
class Row:
    figure: str
    key: str
    unit: str
    baseline_name: str
    baseline: dict[str, Any]
    runner: dict[str, Any]
    ratio: float
    """runner / baseline of the medians (time, or throughput for the jobs figure)."""
    target: str = ""
    met: bool = False
    """Both set from benchmarks/targets.py's table for a figure id it has (``judge``)."""
    paired: dict[str, Any] | None = None
    """runner / baseline per interleaved pair."""
    extra: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def ratio_rows(xs: Sequence[float], ys: Sequence[float]) -> dict[str, Any]:
    return summary([x / y for x, y in zip(xs, ys, strict=True) if y > 0])


def fmt(v: float, unit: str) -> str:
    if unit == "s":
        return f"{v:.3f} s" if v < 10 else f"{v:.1f} s"
    if unit == "jobs/s":
        return f"{v:.2f} jobs/s"
    return f"{v:.3g} {unit}"


def spread(s: dict[str, Any], unit: str) -> str:
    return f"{fmt(s['median'], unit)} [{fmt(s['min'], unit)} to {fmt(s['max'], unit)}]"


def size_text(n: int) -> str:
    return f"{n / GIB:.3g} GiB" if n >= GIB else f"{n / MIB:.3g} MiB"


def progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(*argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, check=True).stdout.strip()


def check_local_engine() -> None:
    host = os.environ.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        raise SystemExit(f"DOCKER_HOST={host}: this benchmark only talks to the local engine")
    ctx = subprocess.run(
        ["docker", "context", "inspect", "--format", "{{.Endpoints.docker.Host}}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if ctx and not ctx.startswith("unix://"):
        raise SystemExit(f"docker context endpoint {ctx}: only the local engine may be used")


def machine_facts() -> dict[str, Any]:
    info = json.loads(sh("docker", "info", "--format", "{{json .}}"))
    vm = psutil.virtual_memory()
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "cpuModel": cpu_model,
        "memoryBytes": vm.total,
        "kernel": platform.release(),
        "os": info.get("OperatingSystem"),
        "python": platform.python_version(),
        "dockerServerVersion": info.get("ServerVersion"),
        "dockerClientVersion": sh("docker", "version", "--format", "{{.Client.Version}}"),
        "storageDriver": info.get("Driver"),
        "cgroupVersion": info.get("CgroupVersion"),
        "cgroupDriver": info.get("CgroupDriver"),
        "runningContainersAtStart": info.get("ContainersRunning"),
        "memoryCgroupsAtStart": memory_cgroups(),
        "loadAverageAtStart": os.getloadavg(),
        "runnerCommit": commit,
        "runnerUncommitted": subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "runner"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split("\n")[:-1],
        "pythonDontWriteBytecode": os.environ.get("PYTHONDONTWRITEBYTECODE", ""),
    }


def memory_cgroups() -> int | None:
    """How many memory cgroups the kernel holds (/proc/cgroups), the dying ones of removed
    containers included: hundreds of them slow the engine (docs/development/tests.md)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/cgroups").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 3 and fields[0] == "memory":
                return int(fields[2])
    return None


def runner_cli() -> list[str]:
    script = Path(sys.executable).parent / "runner"
    return [str(script)] if script.exists() else [sys.executable, "-m", "runner"]


@dataclass
class Bench:
    s: Session
    args: argparse.Namespace
    runner: list[str]
    image_id: str = ""
    limits: dict[str, Any] = field(default_factory=dict)
    toy: Path = Path()
    toy_job: Path = Path()
    """A job folder the runner staged for the toy, whose input/ and execution/ the baseline
    mounts."""
    state: Path = Path()
    n: int = 0

    def job_id(self, tag: str) -> str:
        self.n += 1
        return f"bench-{self.s.id}-{tag}-{self.n}"

    def contract(
        self,
        folder: Path,
        *,
        command: list[str] | None = None,
        measurements: list[dict[str, Any]] | None = None,
        protocol: dict[str, Any] | None = None,
        repository: str | None = None,
        with_toy_inputs: bool = True,
        environment: dict[str, Any] | None = None,
    ) -> Path:
        """A contract in ``folder`` based on the toy one (the tests' writer), pinned."""
        from runner.app import issuer
        from runner.testing import write_contract

        def own_repository(data: dict[str, Any]) -> None:
            data.pop("paper", None)
            data["repository"] = {"url": "https://example.invalid/bench", "commit": "x"}
            data["repository"]["path"] = repository

        folder.mkdir(parents=True, exist_ok=True)
        path = write_contract(
            folder,
            IMAGE,
            command=command,
            protocol=protocol,
            measurements=measurements,
            with_inputs=with_toy_inputs,
            environment=environment,
            change=own_repository if repository is not None else None,
        )
        issuer.pin(path, IMAGE)
        return path

    def run_argv(
        self, contract: Path, job_id: str, state: Path | None = None, extra: Sequence[str] = ()
    ) -> list[str]:
        return [
            *self.runner,
            "run",
            str(contract),
            "--allow-unsigned",
            "--json",
            "--job-id",
            job_id,
            "--state-dir",
            str(state or self.state),
            "--label",
            f"bench={self.s.id}",
            "--label",
            "bench.role=runner",
            *extra,
        ]

    def docker_argv(
        self,
        mounts: list[tuple[Path, str, bool]],
        command: list[str],
        role: str = "baseline",
        detach: bool = False,
    ) -> list[str]:
        """``docker run --rm`` with the caps the runner applied (its envelope's ``limits``)."""
        lim = self.limits
        argv = [
            "docker",
            "run",
            "--rm",
            "--label",
            f"bench={self.s.id}",
            "--label",
            f"bench.role={role}",
            "--network",
            lim["network"],
            "--cap-drop",
            "ALL",
            "--memory",
            str(lim["memoryBytes"]),
            "--memory-swap",
            str(lim["memorySwapBytes"]),
            "--cpus",
            str(lim["cpus"]),
            "--shm-size",
            str(lim["shmBytes"]),
            "--pids-limit",
            str(lim["pidsLimit"]),
            "--tmpfs",
            f"/tmp:rw,nosuid,nodev,size={lim['tmpfsBytes']}",  # noqa: S108 - in the box
            "--log-driver",
            "json-file",
            "--log-opt",
            f"max-size={MIB}",
            "--log-opt",
            "max-file=1",
            "--user",
            lim["user"],
            "--workdir",
            "/job/workspace",
            "-e",
            "HOME=/tmp",
            "-e",
            "NVIDIA_VISIBLE_DEVICES=void",
        ]
        assert list(lim["capDrop"]) == ["ALL"], lim["capDrop"]  # noqa: S101 - a bench sanity check
        for opt in lim["securityOpt"]:
            argv += ["--security-opt", opt]
        if lim["readOnlyRootfs"]:
            argv.append("--read-only")
        if lim["init"]:
            argv.append("--init")
        for src, dst, ro in mounts:
            argv += ["--mount", f"type=bind,src={src},dst={dst}" + (",readonly" if ro else "")]
        if detach:
            argv.append("-d")
        return [*argv, self.image_id, *command]

    def writable(self, *folders: Path) -> None:
        """Fresh folders the job's user may write, as the runner prepares output/."""
        uid, gid = (int(x) for x in self.limits["user"].split(":"))
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                for dirpath, _, files in os.walk(folder):
                    os.chown(dirpath, uid, gid)
                    for name in files:
                        os.chown(Path(dirpath) / name, uid, gid)

    def baseline_mounts(self, out: Path, ws: Path) -> list[tuple[Path, str, bool]]:
        return [
            (self.toy_job / "input", "/job/input", True),
            (out, "/job/output", False),
            (ws, "/job/workspace", False),
            (self.toy_job / "execution", "/job/execution", True),
        ]

    def runner_job(
        self,
        contract: Path,
        tag: str,
        state: Path | None = None,
        sample_rss: bool = False,
        env: dict[str, str] | None = None,
        extra: Sequence[str] = (),
    ) -> tuple[float, dict[str, Any], int, str]:
        """One ``runner run``: (wall seconds, envelope, peak RSS of its process tree, job id)."""
        job_id = self.job_id(tag)
        log = self.s.tmp / "logs" / f"{job_id}.out"
        log.parent.mkdir(exist_ok=True)
        with log.open("wb") as out, (log.with_suffix(".err")).open("wb") as err:
            t0 = time.perf_counter()
            proc = self.s.spawn(
                self.run_argv(contract, job_id, state, extra),
                stdout=out,
                stderr=err,
                env=env or self.s.env,
            )
            sampler = TreeRss(proc.pid) if sample_rss else None
            rc, maxrss = self.s.reap(proc)
            seconds = time.perf_counter() - t0
        peak = max(maxrss, sampler.stop() if sampler else 0)
        try:
            envelope: dict[str, Any] = json.loads(log.read_text())
        except json.JSONDecodeError:
            envelope = {}
        if rc != 0 or envelope.get("status") != "succeeded":
            raise RuntimeError(
                f"runner run {job_id} exited {rc}: {log.with_suffix('.err').read_text()[-2000:]}"
            )
        return seconds, envelope, peak, job_id

    def docker_job(
        self, argv: list[str], stdout: Path, sample_rss: bool = False
    ) -> tuple[float, int]:
        """One ``docker run ... > stdout``: (wall seconds, peak RSS of the docker CLI)."""
        err = stdout.with_suffix(".docker-err")
        with stdout.open("wb") as out, err.open("wb") as errf:
            t0 = time.perf_counter()
            proc = self.s.spawn(argv, stdout=out, stderr=errf)
            sampler = TreeRss(proc.pid) if sample_rss else None
            rc, maxrss = self.s.reap(proc)
            seconds = time.perf_counter() - t0
        peak = max(maxrss, sampler.stop() if sampler else 0)
        if rc != 0:
            raise RuntimeError(f"docker run exited {rc}: {err.read_text()[-2000:]}")
        return seconds, peak


class TreeRss:
    """Samples the summed RSS of a process and its descendants every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.peak = 0
        self._done = threading.Event()
        try:
            self._proc: psutil.Process | None = psutil.Process(pid)
        except psutil.Error:
            self._proc = None
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while self._proc is not None and not self._done.is_set():
            try:
                procs = [self._proc, *self._proc.children(recursive=True)]
            except psutil.Error:
                return
            total = 0
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    total += p.memory_info().rss
            self.peak = max(self.peak, total)
            self._done.wait(0.02)

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak


def interleave(
    reps: int, a: Callable[[], float], b: Callable[[], float]
) -> tuple[list[float], list[float]]:
    """Run ``a`` and ``b`` ``reps`` times each in ABBA order; their samples in pair order."""
    xs: list[float] = []
    ys: list[float] = []
    for i in range(reps):
        if i % 2 == 0:
            xs.append(a())
            ys.append(b())
        else:
            ys.append(b())
            xs.append(a())
    return xs, ys


def timed_command(b: Bench, argv: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    proc = b.s.spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env or b.s.env)
    rc, _ = b.s.reap(proc)
    seconds = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited {rc}")
    return seconds


@contextlib.contextmanager
def served(b: Bench, name: str) -> Iterator[tuple[dict[str, str], Callable[[], int], int]]:
    """A `runner serve` for the duration: the environment that sends `runner run` and
    `runner verify` to it, a count of the commands it has served so far, and its pid."""
    env = {**b.s.env, "RUNNER_SERVER": str(b.s.sockets / f"{name}.sock")}
    log = b.s.tmp / f"{name}.log"
    with log.open("wb") as sink:
        server = b.s.spawn([*b.runner, "serve"], stdout=sink, stderr=sink, env=env)
    try:
        deadline = time.monotonic() + 60
        while "listening on" not in log.read_text():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"runner serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        yield env, lambda: log.read_text().count(": runner "), server.pid
    finally:
        if server.returncode is None:  # not reaped by poll() above
            server.send_signal(signal.SIGTERM)
            b.s.reap(server)


def make_inputs(folder: Path, total: int) -> tuple[int, int]:
    """One big file (3/4 of ``total``) and many 32 KiB files in 64 folders; (files, bytes)."""
    folder.mkdir(parents=True)
    big = total * 3 // 4
    block = os.urandom(MIB)
    with (folder / "checkpoint.bin").open("wb") as f:
        for i in range(big // MIB):
            f.write(i.to_bytes(8, "little") + block[8:])  # no two blocks alike
    small = 32 * 1024
    count = (total - big) // small
    for i in range(count):
        sub = folder / f"shard-{i % 64:02d}"
        sub.mkdir(exist_ok=True)
        (sub / f"part-{i:06d}.bin").write_bytes(os.urandom(small))
    return count + 1, big + count * small


def big_file(path: Path, size: int) -> str:
    """``size`` bytes (whole MiB) no two MiB alike; their hex SHA-256."""
    import hashlib

    digest = hashlib.sha256()
    block = os.urandom(MIB)
    with path.open("wb") as f:
        for i in range(size // MIB):
            chunk = i.to_bytes(8, "little") + block[8:]
            f.write(chunk)
            digest.update(chunk)
    return digest.hexdigest()
