"""The Podman backend: Docker's backend, pointed at Podman's API socket.

Podman serves the Docker Engine API (``podman system service``), so the requests of
:class:`~runner.backends.docker.DockerBackend` reach it unchanged (start, wait, stop, kill,
inspect, logs, remove, list, images); this module overrides only what Podman does differently
(measured with Podman 4.3, Debian bookworm, cgroup v1):

- **Create** goes to Podman's own API (``/libpod/containers/create``) with the same container,
  for one field the compatible API lacks: ``timeout``, the engine's own deadline, which conmon
  enforces with no runner watching. (The Docker backend's deadline is a health check; Podman
  runs health checks from systemd timers, so on a host without systemd it never would.)
- **Caps it would drop.** Rootless Podman on cgroup v1 accepts memory, CPU and pids caps and
  ignores them; on cgroup v2 it applies only the controllers delegated to the user. Before
  anything of the job exists, :meth:`PodmanBackend.check_limits` asks the engine
  (``/libpod/info``: rootless, cgroup version, controllers) and refuses each cap it cannot
  enforce (``policy_violation``, naming the cap; the decision is ``podmancaps``). ``create``
  refuses the same caps, then reads the created container back and removes it if any cap is
  not there.
- **Wait** goes to Podman's own API too, polling every 50 ms (its compatible wait polls every
  250 ms, and the runner charges the budget until it sees the end).
- **Pull** goes to Podman's own API too: its compatible pull asks every registry over HTTPS,
  where Docker speaks plain HTTP to a loopback registry.
- **Runtimes.** The compatible API ignores ``HostConfig.Runtime`` (a runsc request ran under
  runc); only the engine's default runtime is offered, and runsc is refused (not verified).
- **OOM kills.** Podman 4.3 (its conmon) does not set ``State.OOMKilled`` on cgroup v1. When a
  container on this host has ended, the kernel's log (``/dev/kmsg``) is searched for an OOM
  kill in its memory cgroup (``oom_memcg=.../libpod-<id>``).
- **Image names.** Podman names local images ``localhost/NAME:TAG`` and gives a loaded image a
  repo digest of a manifest it wrote itself (no registry ever served it); the ``localhost/``
  prefix is dropped from tags and those digests are not reported, as Docker reports none for a
  loaded image. Image ids (config digests) are the same under both engines.
- **Limits per process.** Rootful Podman sets ``nofile`` and ``nproc`` to 1048576 unless
  ``containers.conf`` says otherwise; where the engine may not raise them (a host that is
  itself a container) every start fails, so ``scripts/setup_podman.sh`` sets them to the
  engine's own limits, as Docker's containers inherit dockerd's.
- **Networks.** ``none`` (the sealed box) and ``bridge`` (a contract granted the network)
  are offered; the egress allowlist and named networks are refused until verified here.
- **GPUs** are refused: Podman hands them out by CDI names on its own API, not through
  Docker's device requests, and no GPU host ran it.

The endpoint is ``CONTAINER_HOST`` (as Podman's own clients read it), else the rootful socket
``/run/podman/podman.sock`` for root and ``$XDG_RUNTIME_DIR/podman/podman.sock`` for others.
"""

from __future__ import annotations

import base64
import errno
import http.client
import json
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from runner.backends.base import ContainerSpec, ContainerState, LogFollow
from runner.backends.docker import DockerBackend
from runner.backends.podmancaps import PodmanHost, refusal
from runner.backends.stats import StatsSample, parse_libpod_stats
from runner.backends.types import ImageInfo, Limits, loopback_registry
from runner.core import untrusted
from runner.core.errors import (
    ContainerVanished,
    EngineUnavailable,
    ImageUnavailable,
    InfrastructureError,
    PolicyViolation,
)

__all__ = ["PodmanBackend", "default_url", "socket_path"]

ROOTFUL_SOCKET = "/run/podman/podman.sock"
_LIBPOD = "/v4.0.0/libpod"
"""Podman's own API (4.0 and later answer at this prefix)."""
_CPU_PERIOD = 100_000
_HINT = "start it (`podman system service --time=0 unix://SOCKET`; scripts/setup_podman.sh " \
    "does for root) and check CONTAINER_HOST"  # fmt: skip
_KMSG_BYTES = 16 * 1024 * 1024
"""The most of the kernel's log read when looking for an OOM kill (its ring is far smaller)."""


def default_url() -> str:
    """Where Podman's API listens for this user: CONTAINER_HOST, else its usual socket."""
    url = os.environ.get("CONTAINER_HOST")
    if url:
        return url
    if os.getuid() == 0:
        return f"unix://{ROOTFUL_SOCKET}"
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    return f"unix://{runtime_dir}/podman/podman.sock"


def libpod_spec(spec: ContainerSpec) -> dict[str, Any]:
    """Podman's own container spec (its SpecGenerator) for ``spec``: the Docker backend's
    container, plus ``timeout``, the engine's own deadline, which conmon enforces on its own
    (the backstop's health check needs systemd timers under Podman)."""
    lim = spec.limits
    mounts: list[dict[str, Any]] = [
        {"destination": m.target, "source": str(m.source), "type": "bind",
         "options": ["rbind", "ro" if m.read_only else "rw"]}
        for m in spec.mounts
    ]  # fmt: skip
    tmp = ["rw", "nosuid", "nodev", f"size={lim.tmpfs_bytes}"]
    mounts.append({"destination": "/tmp", "source": "tmpfs", "type": "tmpfs", "options": tmp})  # noqa: S108 - in the box
    resources: dict[str, Any] = {
        "memory": {"limit": lim.memory_bytes, "swap": lim.memory_swap_bytes},
        "cpu": {"quota": round(lim.cpus * _CPU_PERIOD), "period": _CPU_PERIOD},
    }
    if lim.pids is not None:
        resources["pids"] = {"limit": lim.pids}
    body: dict[str, Any] = {
        "name": spec.name,
        "image": spec.image,
        "entrypoint": spec.entrypoint,
        "command": spec.command,
        "user": spec.user,
        "work_dir": spec.working_dir,
        "env": spec.environment,
        "labels": spec.labels,
        "mounts": mounts,
        "netns": {"nsmode": spec.network or lim.network},
        "read_only_filesystem": lim.read_only_rootfs,
        "cap_drop": list(lim.cap_drop),
        "cap_add": list(lim.cap_add),
        "no_new_privileges": "no-new-privileges" in lim.security_opt,
        "resource_limits": resources,
        "shm_size": lim.shm_bytes,
        "init": lim.init,
        "log_configuration": {"driver": "k8s-file", "size": spec.log_max_bytes},
    }
    if spec.dns:
        body["dns_server"] = list(spec.dns)
    if spec.dns_options:
        body["dns_option"] = list(spec.dns_options)
    if spec.backstop is not None:
        body["timeout"] = spec.backstop.after_seconds
        body["healthconfig"] = spec.backstop.healthcheck()
    return body


def _oom_in_kernel_log(container_id: str) -> bool:
    """Whether the kernel's log records an OOM kill in the container's memory cgroup."""
    needle = f"libpod-{container_id}".encode()
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False  # not ours to read (rootless): the engine's flag is all there is
    read = 0
    try:
        while read < _KMSG_BYTES:
            try:
                record = os.read(fd, 8192)  # one record per read
            except BlockingIOError:
                return False  # the end of the log
            except OSError as exc:
                if exc.errno != errno.EPIPE:
                    return False
                read += 1  # a record was overwritten while reading: go on to the next
                continue
            if not record:
                return False
            read += len(record)
            if b"oom-kill:" in record and b"oom_memcg=" in record and needle in record:
                return True
        return False
    finally:
        os.close(fd)


_LOCAL = re.compile(r"^localhost/")


class PodmanBackend(DockerBackend):
    """Podman through its API socket (``podman system service``): Docker's calls, its own
    for create, wait and pull; refusing every cap it would not enforce."""

    ENGINE = "Podman"
    ENGINE_HINT = _HINT
    PERMISSION_HINT = "run as the user whose Podman socket it is (or root); "

    def __init__(self, base_url: str | None = None, timeout: float = 60.0) -> None:
        super().__init__(base_url or default_url(), timeout)
        self._host: PodmanHost | None = None
        self._host_lock = threading.Lock()
        self._oom: dict[str, bool] = {}

    def host(self) -> PodmanHost:
        """How the engine caps containers, asked once per backend."""
        with self._host_lock:
            if self._host is None:
                action = "asking Podman how it caps containers"
                status, _, data = self._exchange(
                    "GET", f"{_LIBPOD}/info", None, self._timeout, action
                )
                if status != 200:
                    raise EngineUnavailable(
                        f"{action}: /libpod/info answered {status}; is this Podman?",
                        hint="point CONTAINER_HOST (or the policy's engine) at a Podman socket",
                    )
                try:
                    answer = json.loads(data)
                    self._host = PodmanHost.from_info(untrusted.mapping(answer))
                except ValueError as exc:
                    raise InfrastructureError(f"{action}: the answer is not JSON") from exc
            return self._host

    def check_limits(self, limits: Limits) -> None:
        refused = refusal(limits, self.host())
        if refused is not None:
            raise refused

    def runtimes(self) -> list[str]:
        """The engine's default runtime, the one containers get (another, such as runsc,
        is not offered: not verified under Podman)."""
        return [self.host().runtime or "runc"]

    def gpu_capable(self) -> bool:
        return False

    def cdi_native(self) -> bool:
        return False

    def inspect_image(self, reference: str) -> ImageInfo | None:
        info = super().inspect_image(reference)
        if info is None:
            return None
        return ImageInfo(
            id=info.id,
            repo_digests=tuple(d for d in info.repo_digests if not _LOCAL.match(d)),
            repo_tags=tuple(_LOCAL.sub("", t) for t in info.repo_tags),
            architecture=info.architecture,
            os=info.os,
            size=info.size,
            env=info.env,
        )

    def create(self, spec: ContainerSpec) -> str:
        self.check_limits(spec.limits)
        action = "creating the job container"
        if (
            spec.gpu_ids
            or spec.devices
            or spec.extra_networks
            or spec.aliases
            or (spec.network not in (None, "none", "bridge"))
        ):
            raise PolicyViolation(
                f"{action}: {spec.name} asks for GPUs or networks this backend does not offer "
                "on Podman (not verified there)",
                hint="run it with Docker (host policy engine)",
            )
        status, _, data = self._exchange(
            "POST", f"{_LIBPOD}/containers/create", libpod_spec(spec), self._timeout, action
        )
        try:
            answer = json.loads(data) if data else {}
        except ValueError:
            answer = {"message": data.decode(errors="replace").strip()}
        if status >= 400 or not isinstance(answer, dict) or "Id" not in answer:
            message = answer.get("message", "") if isinstance(answer, dict) else ""
            raise InfrastructureError(f"{action}: the engine answered {status}: {message}")
        container_id = str(answer["Id"])
        try:
            self._verify_caps(container_id, spec.limits)
        except BaseException:
            self.remove(container_id)
            raise
        return container_id

    def pull(
        self,
        reference: str,
        auth: dict[str, str] | None,
        on_progress: Callable[[dict[str, Any]], None],
    ) -> None:
        """Podman's own pull: its compatible one always asks a registry over HTTPS, where
        Docker speaks plain HTTP to a loopback registry. A loopback registry is asked over
        HTTP here too (others as ``registries.conf`` says, as Docker's daemon.json does)."""
        action = f"pulling {reference}"
        query = [("reference", reference), ("policy", "always")]
        if loopback_registry(reference.split("/", 1)[0]):
            query.append(("tlsVerify", "false"))
        headers = {}
        if auth:
            headers["X-Registry-Auth"] = base64.urlsafe_b64encode(
                json.dumps(auth).encode()
            ).decode()
        errors: list[str] = []

        def follow(response: http.client.HTTPResponse) -> None:
            for line in response:
                try:
                    chunk = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(chunk, dict):
                    continue
                if chunk.get("error"):
                    errors.append(str(chunk["error"]))
                on_progress(chunk)

        status, _, data = self._exchange(
            "POST", f"{_LIBPOD}/images/pull?{urlencode(query)}", None, self._timeout, action,
            stream_to=follow, headers=headers,
        )  # fmt: skip
        if status >= 300 or errors:
            message = errors[0] if errors else data.decode(errors="replace").strip()
            raise ImageUnavailable(
                f"the engine could not pull {reference}: {message}",
                hint="check the registry and the digest; `podman pull` shows the same",
            )

    def wait(self, container_id: str, timeout: float) -> int | None:
        """Podman's own wait, polling the container every 50 ms: its compatible wait polls
        every 250 ms, and the runner charges the budget until it sees the end. One request
        for the whole run, kept between the watch's ticks, as Docker's is."""
        action = "waiting for the job container"
        path = f"{_LIBPOD}/containers/{quote(container_id)}/wait?" + urlencode(
            [("condition", "exited"), ("condition", "stopped"), ("interval", "50ms")]
        )
        answer = self._kept_answer(container_id, path, timeout, action)
        if answer is None:
            return None  # it still runs: the request stays, and says when it ends
        status, data = answer
        if status == 404:
            raise ContainerVanished(
                f"{action}: container {container_id[:12]} no longer exists "
                "(removed by someone else, or the engine lost it)"
            )
        try:
            if status >= 400:
                raise ValueError(data.decode(errors="replace").strip())
            return int(json.loads(data))
        except (ValueError, TypeError) as exc:
            raise InfrastructureError(f"{action}: the engine answered {status}: {exc}") from exc

    def _verify_caps(self, container_id: str, limits: Limits) -> None:
        """Refuse a created container that lacks a cap it was given (a drop the checks above
        did not foresee): read back, nothing is taken on trust."""
        data = self._container_call("GET", container_id, "/json", "checking the container's caps")
        hc = data.get("HostConfig") or {}
        want = {
            "Memory": limits.memory_bytes,
            "MemorySwap": limits.memory_swap_bytes,
            "CpuQuota": round(limits.cpus * _CPU_PERIOD),
            "CpuPeriod": _CPU_PERIOD,
        }
        if limits.pids is not None:
            want["PidsLimit"] = limits.pids
        for key, value in want.items():
            if hc.get(key) != value:
                raise PolicyViolation(
                    f"Podman created the container with {key} {hc.get(key)!r}, not {value}: it "
                    "dropped or changed a cap, so the job is refused rather than run without it",
                    hint="run it with rootful Podman or Docker (host policy engine)",
                )

    def follow_stats(
        self,
        container_id: str,
        sink: Callable[[StatsSample], None],
        handle: LogFollow | None = None,
    ) -> None:
        """Podman's own stats stream (its Docker-compatible one, in 4.3, answers once and
        then nothing until the container ends); its shape is libpod's, without a peak."""
        query = urlencode({"containers": container_id, "stream": "true", "interval": 1})
        self._follow_stats(
            f"{_LIBPOD}/containers/stats?{query}",
            parse_libpod_stats,
            container_id,
            sink,
            handle,
        )

    def state(self, container_id: str) -> ContainerState:
        got = super().state(container_id)
        if got.running or got.oom_killed or not got.id or got.exit_code is None:
            return got
        oom = self._oom.get(got.id)
        if oom is None:
            oom = self._oom[got.id] = _oom_in_kernel_log(got.id)
        if not oom:
            return got
        return ContainerState.from_engine({**got.raw, "OOMKilled": True}, got.id)


def socket_path(url: str) -> Path | None:
    """The socket file of a ``unix://`` URL (None for any other)."""
    return Path(url[len("unix://") :]) if url.startswith("unix://") else None
