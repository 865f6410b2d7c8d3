"""An in-memory backend for tests of the runner's own logic: no engine, no container.

It implements :class:`~runner.backends.base.Backend` the way the Docker engine behaves as far
as the runner can tell (the same states, the same errors), and is scripted per container with
a :class:`FakeJob`: how long it runs, its exit code, whether it was OOM-killed, ignores SIGTERM,
vanishes, fails to start, and what it writes into its mounted folders (its "work", done at
start). Engine failures are scripted per call with ``fail``. Time is real (a fake container
runs for ``seconds`` of wall time), so tests keep budgets and ticks short.

Shipped beside the real backend, as httpx ships its MockTransport: the fake is part of the
seam, and anyone testing code above it can use it. Tests that touch real containers use the
real engine; this fake replaces none of them.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import stat
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from runner.backends.base import (
    ContainerSpec,
    ContainerState,
    ContainerSummary,
    LogFollow,
    NetworkInfo,
    NetworkSummary,
)
from runner.backends.stats import StatsSample, parse_stats
from runner.backends.types import EngineInfo, ImageInfo, Limits, PathStat
from runner.core import clock
from runner.core.errors import ContainerVanished, ImageUnavailable, InfrastructureError, RunnerError

__all__ = ["FakeBackend", "FakeJob"]


@dataclass(frozen=True)
class FakeJob:
    """What one fake container does once started."""

    exit_code: int = 0
    seconds: float = 0.0
    """How long it runs before it exits by itself (``float('inf')``: until stopped)."""
    oom_killed: bool = False
    """It ends with exit code 137 and ``OOMKilled`` true."""
    oom_late: bool = False
    """With ``oom_killed``: the engine's ``OOMKilled`` stays false (its OOM event came after
    the exit's), and the event is in its log (:meth:`FakeBackend.oom_logged`)."""
    ignores_sigterm: bool = False
    """A stop ends it with SIGKILL (137) after the grace, not SIGTERM (143)."""
    vanish_after: float | None = None
    """Seconds after its start when it disappears, as if someone removed it."""
    start_error: str | None = None
    """The engine refuses to start it with this message (its State.Error)."""
    work: Callable[[dict[str, Path]], None] | None = None
    """Called at start with ``{container path: host folder}`` of its mounts: what it writes."""
    log: bytes = b""
    """Its engine log once started (what ``save_logs`` writes)."""
    stats: tuple[object, ...] = ()
    """The engine's stats answers while it runs (JSON text or decoded values, Docker's
    shape), handed out in order by ``follow_stats``, all at once (no sleep)."""


def _iso(when: datetime | None) -> str:
    if when is None:
        return "0001-01-01T00:00:00Z"
    return when.isoformat().replace("+00:00", "Z")


@dataclass
class _Container:
    id: str
    spec: ContainerSpec
    job: FakeJob
    status: str = "created"
    exit_code: int = 0
    oom_killed: bool = False
    error: str = ""
    started: float | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    def advance(self, now: float) -> None:
        """Bring the state up to ``now``: a running job whose time is up has exited."""
        started = self.started
        if self.status == "running" and started is not None and now - started >= self.job.seconds:
            self.end(137 if self.job.oom_killed else self.job.exit_code)
            self.oom_killed = self.job.oom_killed and not self.job.oom_late

    def end(self, code: int) -> None:
        self.status, self.exit_code = "exited", code
        self.finished_at = clock.now()

    def state(self) -> ContainerState:
        raw = {
            "Status": self.status,
            "Running": self.status == "running",
            "OOMKilled": self.oom_killed,
            "ExitCode": self.exit_code,
            "Error": self.error,
            "StartedAt": _iso(self.started_at),
            "FinishedAt": _iso(self.finished_at),
        }
        return ContainerState.from_engine(raw, self.id)


@dataclass
class FakeBackend:
    """A scripted engine. ``jobs`` says what each container does (one :class:`FakeJob` for all,
    or a function of the container's spec); ``fail`` makes a call raise (method name → the
    error, or a function of the call's first argument returning an error or None)."""

    jobs: FakeJob | Callable[[ContainerSpec], FakeJob] = field(default_factory=FakeJob)
    fail: dict[str, RunnerError | Callable[[Any], RunnerError | None]] = field(default_factory=dict)
    images: dict[str, ImageInfo] = field(default_factory=dict)
    pullable: dict[str, ImageInfo] = field(default_factory=dict)
    """References a pull finds, and the image each brings."""
    gpus: bool = False
    cdi: bool = False
    installed_runtimes: tuple[str, ...] = ("runc", "runsc")
    calls: list[tuple[str, str]] = field(default_factory=list)
    """Every call made, as ``(method, first argument)``: for assertions."""
    frozen: bool = False
    """The calling runner has died (a test simulating kill -9): stop, kill and remove reach
    no engine, so its containers stay as a dead runner leaves them."""
    containers: dict[str, _Container] = field(default_factory=dict)
    networks: dict[str, NetworkSummary] = field(default_factory=dict)
    """Networks by name (add one with ``create_network``)."""
    roots: dict[str, Path] = field(default_factory=dict)
    """Image id → a host folder standing for that image's filesystem (``image_files``)."""
    start_seconds: float = 0.0
    """How long a start call takes (on :mod:`runner.core.clock`), the container starting
    halfway through it as a real engine's does: after the runner's ``attempt.started``,
    within the call."""
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    # ------------------------------------------------------------------ helpers for tests

    def add_image(self, tag: str = "fake:latest", *, content: str = "fake") -> ImageInfo:
        """A local image; its id is derived from ``content``."""
        image_id = "sha256:" + hashlib.sha256(content.encode()).hexdigest()
        info = ImageInfo(image_id, (), (tag,), "x86_64", "linux", 1234)
        self.images[image_id] = info
        return info

    def running(self) -> list[str]:
        now = clock.monotonic()
        for c in self.containers.values():
            c.advance(now)
        return [c.spec.name for c in self.containers.values() if c.status == "running"]

    # ------------------------------------------------------------------ internals

    def _call(self, method: str, arg: Any = "") -> None:
        self.calls.append((method, str(arg)))
        failure = self.fail.get(method)
        error = failure(arg) if callable(failure) else failure
        if error is not None:
            raise error

    def _get(self, ref: str) -> _Container:
        now = clock.monotonic()
        for c in list(self.containers.values()):
            if ref in (c.id, c.spec.name):
                gone = c.job.vanish_after
                if gone is not None and c.started is not None and now - c.started >= gone:
                    del self.containers[c.id]
                    break
                c.advance(now)
                return c
        raise ContainerVanished(f"container {ref} is gone (fake engine)")

    # ------------------------------------------------------------------ Backend

    def ping(self) -> None:
        self._call("ping")

    def inspect_image(self, reference: str) -> ImageInfo | None:
        self._call("inspect_image", reference)
        for info in self.images.values():
            if reference == info.id or reference in info.repo_tags + info.repo_digests:
                return info
        return None

    def pull(
        self,
        reference: str,
        auth: dict[str, str] | None,
        on_progress: Callable[[dict[str, Any]], None],
    ) -> None:
        self._call("pull", reference)
        info = self.pullable.get(reference)
        if info is None:
            raise ImageUnavailable(f"pulling {reference}: not found (fake registry)")
        on_progress({"status": "Downloaded newer image", "id": info.id})
        digest = reference.partition("@")[2]
        self.images[info.id] = ImageInfo(
            info.id, (reference,) if digest else (), info.repo_tags, "x86_64", "linux", info.size
        )

    def load(self, bundle: Path) -> None:
        self._call("load", bundle)
        raise ImageUnavailable(f"the fake engine loads no bundles ({bundle})")

    def runtimes(self) -> list[str]:
        self._call("runtimes")
        return list(self.installed_runtimes)

    def gpu_capable(self) -> bool:
        return self.gpus

    def cdi_native(self) -> bool:
        return self.cdi

    def architecture(self) -> str:
        return "x86_64"

    def engine(self) -> EngineInfo:
        return EngineInfo("fake", "0", "1.41")

    def check_limits(self, limits: Limits) -> None:
        """Every cap holds, unless ``fail["check_limits"]`` says otherwise."""
        self._call("check_limits", limits)

    def create(self, spec: ContainerSpec) -> str:
        self._call("create", spec.name)
        if any(c.spec.name == spec.name for c in self.containers.values()):
            raise InfrastructureError(f"creating {spec.name}: the name is in use (fake engine)")
        for name in spec.extra_networks:
            if name not in self.networks:
                raise InfrastructureError(f"connecting {spec.name}: no network {name} (fake)")
        cid = hashlib.sha256(f"{spec.name}-{next(self._ids)}".encode()).hexdigest()
        job = self.jobs(spec) if callable(self.jobs) else self.jobs
        self.containers[cid] = _Container(cid, spec, job)
        return cid

    def start(self, container_id: str) -> None:
        self._call("start", container_id)
        c = self._get(container_id)
        if c.job.start_error is not None:
            c.error, c.exit_code = c.job.start_error, 127
            raise InfrastructureError(f"starting the job container: {c.job.start_error}")
        if self.start_seconds:
            clock.sleep(self.start_seconds / 2)
        c.status, c.started, c.started_at = "running", clock.monotonic(), clock.now()
        if c.job.work is not None:
            c.job.work({m.target: m.source for m in c.spec.mounts})
        if self.start_seconds:
            clock.sleep(self.start_seconds / 2)

    def wait(self, container_id: str, timeout: float) -> int | None:
        self._call("wait", container_id)
        c = self._get(container_id)
        if c.status == "running" and c.started is not None:
            left = c.job.seconds - (clock.monotonic() - c.started)
            vanish = c.job.vanish_after
            if vanish is not None:
                left = min(left, vanish - (clock.monotonic() - c.started))
            clock.sleep(max(min(left, timeout), 0.0))
            c = self._get(container_id)
        return None if c.status == "running" else c.exit_code

    def stop(self, container_id: str, grace: float) -> None:
        self._call("stop", container_id)
        if self.frozen:
            return
        c = self._get(container_id)
        if c.status == "running":
            c.end(137 if c.job.ignores_sigterm else 143)

    def kill(self, container_id: str) -> None:
        self._call("kill", container_id)
        if self.frozen:
            return
        c = self._get(container_id)
        if c.status == "running":
            c.end(137)

    def state(self, container_id: str) -> ContainerState:
        self._call("state", container_id)
        return self._get(container_id).state()

    def oom_logged(self, container_id: str, since: float) -> bool:
        self._call("oom_logged", container_id)
        return self._get(container_id).job.oom_killed

    def save_logs(
        self, container_id: str, dest: Path, max_bytes: int, since: float | None = None
    ) -> int:
        self._call("save_logs", container_id)  # ``since`` is not kept: the whole log
        c = self._get(container_id)
        log = c.job.log[:max_bytes] if c.started is not None else b""
        dest.write_bytes(log)
        return len(log)

    def follow_logs(
        self,
        container_id: str,
        sink: Callable[[bytes], None],
        *,
        stdout: bool = True,
        stderr: bool = False,
        since: float | None = None,
        follow: bool = True,
        handle: LogFollow | None = None,
    ) -> None:
        """A fake job's stdout is what its ``work`` wrote to ``$RUNNER_STDOUT`` (read once, at
        the call); a container without one logs its ``log``."""
        self._call("follow_logs", container_id)
        c = self._get(container_id)
        if c.started is None:
            return
        where = c.spec.environment.get("RUNNER_STDOUT", "")
        outputs = [m.source for m in c.spec.mounts if m.target == "/job/output"]
        if stdout and where.startswith("/job/output/") and outputs:
            path = outputs[0] / where.removeprefix("/job/output/")
            if path.is_file() and not path.is_symlink():
                sink(path.read_bytes())
                return
        if c.job.log:
            sink(c.job.log)

    def follow_stats(
        self,
        container_id: str,
        sink: Callable[[StatsSample], None],
        handle: LogFollow | None = None,
    ) -> None:
        """A fake job's ``stats``, each parsed as the real engine's are; the stream ends at
        the first that is no sample (as Docker's zero answer ends it)."""
        self._call("follow_stats", container_id)
        c = self._get(container_id)
        if c.started is None:
            return
        for raw in c.job.stats:
            if handle is not None and handle.cancelled:
                return
            sample = parse_stats(raw)
            if sample is None:
                return
            sink(sample)

    def remove(self, container_id: str) -> None:
        self._call("remove", container_id)
        if self.frozen:
            return
        for c in list(self.containers.values()):
            if container_id in (c.id, c.spec.name):
                del self.containers[c.id]

    def find(self, labels: dict[str, str]) -> list[ContainerSummary]:
        self._call("find", labels)
        return [
            ContainerSummary(c.id, c.spec.name, c.status, dict(c.spec.labels))
            for c in self.containers.values()
            if all(c.spec.labels.get(k) == v for k, v in labels.items())
        ]

    def create_network(self, name: str, labels: dict[str, str], *, internal: bool) -> NetworkInfo:
        self._call("create_network", name)
        if name in self.networks:
            raise InfrastructureError(f"creating the network {name}: it exists (fake engine)")
        n = len(self.networks) + 20
        self.networks[name] = NetworkSummary(f"net{n}", name, dict(labels))
        return NetworkInfo(f"net{n}", name, f"172.{n}.0.0/16", f"172.{n}.0.1")

    def remove_network(self, name: str) -> None:
        self._call("remove_network", name)
        if self.frozen or name not in self.networks:
            return
        on = [c.spec.name for c in self.containers.values() if c.status == "running"
              and name in (c.spec.network, *c.spec.extra_networks)]  # fmt: skip
        if on:
            raise InfrastructureError(f"removing the network {name}: {on} still on it (fake)")
        del self.networks[name]

    def find_networks(self, labels: dict[str, str]) -> list[NetworkSummary]:
        self._call("find_networks", labels)
        wanted = labels.items()
        return [n for n in self.networks.values() if all(n.labels.get(k) == v for k, v in wanted)]

    @contextlib.contextmanager
    def image_files(self, image_id: str, labels: dict[str, str]) -> Iterator[_FakeFiles]:
        self._call("image_files", image_id)
        root = self.roots.get(image_id)
        if root is None:
            raise InfrastructureError(f"the fake engine has no files for {image_id}")
        yield _FakeFiles(root)


class _FakeFiles:
    """An image's files: a host folder (links resolved inside it, as the engine does)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _host(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def _resolve(self, path: str) -> str:
        parts: list[str] = []
        todo = [p for p in path.split("/") if p]
        hops = 0
        while todo:
            part = todo.pop(0)
            if part == "..":
                if parts:
                    parts.pop()
                continue
            here = self.root.joinpath(*parts, part)
            if here.is_symlink():
                hops += 1
                if hops > 40:  # the engine answers 500 for links that loop
                    raise InfrastructureError(f"the fake engine answered 500 for {path}")
                target = os.readlink(here)
                if target.startswith("/"):
                    parts = []
                todo = [p for p in target.split("/") if p] + todo
                continue
            parts.append(part)
        return "/" + "/".join(parts)

    def stat(self, path: str) -> PathStat | None:
        """As the engine's archive HEAD: the folders on the way resolved in the image (a file
        or links that loop there: 500, an InfrastructureError), the last component not."""
        parent, _, base = path.rstrip("/").rpartition("/")
        if base:
            at = self.root / self._resolve(parent).lstrip("/")
            if os.path.lexists(at) and not at.is_dir():
                raise InfrastructureError(f"the fake engine answered 500 for {path}")
            host = at / base
        else:
            host = self.root
        try:
            st = os.lstat(host)
        except (FileNotFoundError, NotADirectoryError):
            return None
        mode = st.st_mode & 0o7777
        target = ""
        if stat.S_ISDIR(st.st_mode):
            mode |= 1 << 31
        elif stat.S_ISLNK(st.st_mode):
            mode |= 1 << 27
            target = self._resolve(path)
        elif not stat.S_ISREG(st.st_mode):
            mode |= 1 << 26
        return PathStat(path, st.st_size, mode, target)

    def archive(self, path: str, dest: Path, max_bytes: int) -> None:
        host = self._host(path)
        if not os.path.lexists(host):
            raise InfrastructureError(f"the fake engine: no {path}")
        with tarfile.open(dest, "w") as tar:
            tar.add(host, arcname=os.path.basename(path.rstrip("/")))
        if dest.stat().st_size > max_bytes:
            dest.unlink()
            raise InfrastructureError(f"{path} is more than {max_bytes:,} bytes as an archive")
