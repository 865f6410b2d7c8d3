"""The Docker engine backend: every container and image of a run goes through it (only
``runner --version``, in ``runner.cli``, asks the engine something else: its version).

Two transports. Container work (create, start, wait, inspect, logs, remove, list) goes over
the Engine API with the standard library's ``http.client`` on the engine's socket
(``runner.backends.transport``: the connection, its deadlines, the capped reads): it is the hot
path of every job, and importing the docker SDK (with requests and urllib3) cost about 0.2 s
of start-up per ``runner run``, more than the engine spends creating the container. Image
transfers (pull with registry auth and progress, load of a bundle) go through the docker SDK,
imported only when an image has to move, where its start-up is noise next to the transfer.

The endpoint is ``DOCKER_HOST`` as the docker CLI reads it: ``unix://PATH`` (the default,
``/var/run/docker.sock``) or ``tcp://HOST:PORT``, with TLS when ``DOCKER_TLS_VERIFY`` is set
(``ca.pem``, ``cert.pem`` and ``key.pem`` from ``DOCKER_CERT_PATH``, default ``~/.docker``).
The API version is negotiated once per backend from ``/_ping`` (the engine's own, capped at
the newest this module was written against), as the docker CLI does.

Long on purpose: each engine is one module behind the seam, so every call the runner makes
of Docker (containers, networks, images, archives, stats, logs) stays in this one file, with
Podman's differences in ``runner.backends.podman``; the transport under both is a module of
its own.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from runner.backends import transport
from runner.backends.base import (
    ContainerSpec,
    ContainerState,
    ContainerSummary,
    LogFollow,
    NetworkInfo,
    NetworkSummary,
)
from runner.backends.stats import STATS_LINE_MAX, StatsSample, parse_stats
from runner.backends.types import (
    EngineInfo,
    ImageInfo,
    Limits,
    PathStat,
    engine_env,
    engine_refs,
    engine_size,
    engine_text,
)
from runner.core import clock
from runner.core.errors import (
    ContainerVanished,
    EngineUnavailable,
    GpuUnavailable,
    ImageUnavailable,
    InfrastructureError,
)

if TYPE_CHECKING:
    import docker

__all__ = ["MAX_API_VERSION", "DockerBackend"]

ENGINE_WORDS_MAX = 1000
"""The most characters kept of the engine's words about a pull or a load that failed (they
quote a registry's, which may be anything): printable ASCII (:func:`engine_text`)."""
OOM_EVENTS_MAX_BYTES = 64 * 1024
"""The most of the engine's answer read for a container's ``oom`` events (one is enough)."""

_MAX_API = (1, 45)
"""The newest Engine API version the requests below were written against."""
MAX_API_VERSION = f"{_MAX_API[0]}.{_MAX_API[1]}"
"""The same, as ``runner --version`` says it."""
_NO_TIMEOUT = 30 * 24 * 3600.0
"""A followed log's socket waits this long for the next bytes: in effect, as long as the
container runs (the engine ends the stream when it ends; :class:`LogFollow` cancels it)."""


_GPU_START_ERROR = re.compile(r"device driver|nvidia-container|nvidia", re.IGNORECASE)
_ENGINE_HINT = "start it (`scripts/setup.sh` does) and check DOCKER_HOST"


class _NotFound(Exception):
    """The engine answered 404 (turned into ContainerVanished or None by the caller)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@contextlib.contextmanager
def _sdk_errors(action: str) -> Iterator[None]:
    """Translate the docker SDK's errors (image transfers) into the runner's error tree."""
    import docker.errors
    import requests

    try:
        yield
    except docker.errors.APIError as exc:
        raise InfrastructureError(
            f"{action}: the engine answered {exc.status_code}: "
            + engine_text(str(exc.explanation or exc), ENGINE_WORDS_MAX)
        ) from exc
    except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
        raise EngineUnavailable(
            f"{action}: the Docker engine cannot be reached ({type(exc).__name__})",
            hint=_ENGINE_HINT,
        ) from exc
    except docker.errors.DockerException as exc:
        raise EngineUnavailable(
            f"{action}: {engine_text(str(exc), ENGINE_WORDS_MAX)}", hint=_ENGINE_HINT
        ) from exc


class DockerBackend:
    """The runner's container engine: Engine API calls over ``http.client`` (a fresh
    connection per call, so threads never share one, but for a watched container's wait,
    kept open from one tick to the next), the docker SDK for image transfers."""

    ENGINE = "Docker"
    """The engine's name in messages."""
    ENGINE_HINT = _ENGINE_HINT
    PERMISSION_HINT = "run as a user in the docker group (or root); "

    def __init__(self, base_url: str | None = None, timeout: float = 60.0) -> None:
        self._base_url = base_url
        self._timeout = timeout
        self._url = transport.engine_url(base_url)
        self._connect = transport.endpoint(self._url)
        self._prefix_lock = threading.Lock()
        self._waits = transport.KeptRequests(self._connect)
        """Each watched container's wait request, kept from one look to the next."""
        self._sdk: docker.APIClient | None = None

    # -- transport -------------------------------------------------------------------------

    def _negotiate(self, action: str) -> str:
        """Ping the engine and agree on the API version (its own, capped at ours)."""
        _, headers, _ = self._exchange("GET", "/_ping", None, self._timeout, action)
        server = headers.get("API-Version") or "1.41"
        try:
            have = tuple(int(x) for x in server.split(".")[:2])
        except ValueError:
            have = (1, 41)
        major, minor = min(have, _MAX_API)
        prefix = transport.KNOWN[(self._url, "prefix")] = f"/v{major}.{minor}"
        return prefix

    def _version_prefix(self, action: str) -> str:
        with self._prefix_lock:
            known = transport.KNOWN.get((self._url, "prefix"))
            return known if known is not None else self._negotiate(action)

    def _exchange(
        self,
        method: str,
        path: str,
        body: Any,
        timeout: float | None,
        action: str,
        *,
        stream_to: Callable[[http.client.HTTPResponse], None] | None = None,
        headers: dict[str, str] | None = None,
        opened: Callable[[http.client.HTTPConnection], None] | None = None,
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        conn = self._connect(timeout)
        if stream_to is None and timeout is not None and isinstance(conn, transport.UnixConnection):
            # The whole answer within ``timeout``, not each receive (a stream, logs or an
            # archive, is read by its caller under its own caps).
            conn.deadline = time.monotonic() + timeout
        headers = {"Host": "docker", **(headers or {})}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=payload, headers=headers)
            sock = conn.sock  # taken now: an answer that closes the connection unsets it
            if opened is not None:
                opened(conn)
            response = conn.getresponse()
            if stream_to is not None and response.status < 300:
                stream_to(response)
                data = b""
            else:
                data = self._capped(transport.read_within(response, sock, timeout), action)
            return response.status, response.msg, data
        except (OSError, http.client.HTTPException) as exc:
            raise self._unreachable(action, exc) from exc
        finally:
            conn.close()

    def _unreachable(self, action: str, exc: Exception) -> EngineUnavailable:
        """The error for an exchange that failed on the way (``exc``: the transport's)."""
        hint = self.ENGINE_HINT
        if isinstance(exc, PermissionError):
            hint = self.PERMISSION_HINT + hint
        return EngineUnavailable(
            f"{action}: the {self.ENGINE} engine cannot be reached ({type(exc).__name__}: {exc})",
            hint=hint,
        )

    def _capped(self, data: bytes, action: str) -> bytes:
        """``data``, unless it is past the most of an answer read into memory."""
        if len(data) > transport.MAX_ANSWER_BYTES:
            raise EngineUnavailable(
                f"{action}: the {self.ENGINE} engine answered more than "
                f"{transport.MAX_ANSWER_BYTES:,} bytes; not read further",
                hint="is DOCKER_HOST (or the policy's engine) a real engine?",
            )
        return data

    def _kept_answer(
        self, key: str, path: str, timeout: float, action: str
    ) -> tuple[int, bytes] | None:
        """The answer to ``POST path`` (whole, prefixed), which comes when something ends
        (``key``: a container's wait), once the engine gives it within ``timeout`` seconds;
        None before. The request is kept from one call to the next
        (:class:`~runner.backends.transport.KeptRequests`): a running job costs the engine one
        request, not one a look."""
        try:
            answer = self._waits.answer(key, path, timeout)
        except (OSError, http.client.HTTPException) as exc:
            raise self._unreachable(action, exc) from exc
        return None if answer is None else (answer[0], self._capped(answer[1], action))

    def _call(
        self,
        method: str,
        path: str,
        action: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        timeout: float | None = None,
        ok: tuple[int, ...] = (),
        stream_to: Callable[[http.client.HTTPResponse], None] | None = None,
        opened: Callable[[http.client.HTTPConnection], None] | None = None,
    ) -> Any:
        """One Engine API call; the decoded JSON answer (None when empty). 404 raises
        ``_NotFound``; other errors the runner's own, except the statuses in ``ok``."""
        url = self._version_prefix(action) + path
        if query:
            url += "?" + urlencode(query)
        status, _, data = self._exchange(
            method,
            url,
            body,
            self._timeout if timeout is None else timeout,
            action,
            stream_to=stream_to,
            opened=opened,
        )
        return self._decoded(status, data, action, ok)

    def _decoded(self, status: int, data: bytes, action: str, ok: tuple[int, ...] = ()) -> Any:
        """An answer's JSON (None when empty). 404 raises ``_NotFound``; other errors the
        runner's own, except the statuses in ``ok``."""
        if status >= 400 and status not in ok:
            try:
                message = str(json.loads(data).get("message", ""))
            except (ValueError, AttributeError):
                message = data.decode(errors="replace").strip()
            if status == 404:
                raise _NotFound(message)
            raise InfrastructureError(f"{action}: the engine answered {status}: {message}")
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError as exc:
            raise InfrastructureError(f"{action}: the engine's answer is not JSON") from exc

    def _container_call(
        self, method: str, container_id: str, tail: str, action: str, **kwargs: Any
    ) -> Any:
        try:
            return self._call(method, f"/containers/{quote(container_id)}{tail}", action, **kwargs)
        except _NotFound as exc:
            raise ContainerVanished(
                f"{action}: container {container_id[:12]} no longer exists "
                "(removed by someone else, or the engine lost it)",
            ) from exc

    def _sdk_client(self) -> docker.APIClient:
        """The docker SDK, for image transfers only (imported on first use)."""
        if self._sdk is None:
            import docker

            with _sdk_errors("connecting to the engine"):
                if self._base_url:
                    self._sdk = docker.APIClient(base_url=self._base_url, timeout=self._timeout)
                else:
                    self._sdk = docker.from_env(timeout=self._timeout).api
        return self._sdk

    # -- the Backend interface ---------------------------------------------------------------

    def ping(self) -> None:
        with self._prefix_lock:
            self._negotiate("pinging the engine")

    def inspect_image(self, reference: str) -> ImageInfo | None:
        try:
            data: dict[str, Any] = self._call(
                "GET",
                f"/images/{quote(reference, safe='/:@')}/json",
                f"inspecting image {reference}",
            )
        except _NotFound:
            return None
        # The engine's word, kept only as far as the runner can compare and record it: an id
        # or a name with a character no reference holds never matches a pin, and nothing it
        # says can break a record's JSON (types.engine_text and its neighbours).
        data = data if isinstance(data, dict) else {}
        config = data.get("Config")
        return ImageInfo(
            id=engine_text(data.get("Id")),
            repo_digests=engine_refs(data.get("RepoDigests")),
            repo_tags=engine_refs(data.get("RepoTags")),
            architecture=engine_text(data.get("Architecture")),
            os=engine_text(data.get("Os")),
            size=engine_size(data.get("Size")),
            env=engine_env(config.get("Env") if isinstance(config, dict) else None),
        )

    def pull(
        self,
        reference: str,
        auth: dict[str, str] | None,
        on_progress: Callable[[dict[str, Any]], None],
    ) -> None:
        api = self._sdk_client()
        with _sdk_errors(f"pulling {reference}"):
            stream = api.pull(reference, stream=True, decode=True, auth_config=auth)
            for chunk in stream:
                if "error" in chunk or "errorDetail" in chunk:
                    detail = chunk.get("errorDetail") or {}
                    message = detail.get("message") or chunk.get("error") or str(chunk)
                    message = engine_text(str(message), ENGINE_WORDS_MAX)
                    raise ImageUnavailable(
                        f"the engine could not pull {reference}: {message}",
                        hint="check the registry and the digest; `docker pull` shows the same",
                    )
                on_progress(chunk)

    def load(self, bundle: Path) -> None:
        api = self._sdk_client()
        with _sdk_errors(f"loading {bundle.name}"), bundle.open("rb") as data:
            for chunk in api.load_image(data, quiet=True):
                if "error" in chunk or "errorDetail" in chunk:
                    detail = chunk.get("errorDetail") or {}
                    message = detail.get("message") or chunk.get("error") or str(chunk)
                    message = engine_text(str(message), ENGINE_WORDS_MAX)
                    raise ImageUnavailable(f"the engine could not load {bundle}: {message}")

    def gpu_capable(self) -> bool:
        """Whether the engine can hand NVIDIA GPUs to containers: an ``nvidia`` runtime, or the
        NVIDIA container toolkit's hook on the engine's host (this runner's engine is local)."""
        import shutil

        if "nvidia" in self.runtimes():
            return True
        return shutil.which("nvidia-container-runtime-hook") is not None

    def cdi_native(self) -> bool:
        """Docker 25+ lists its CDI spec folders in /info while the ``cdi`` feature is on."""
        info = self._call("GET", "/info", "asking the engine about CDI") or {}
        return bool(info.get("CDISpecDirs"))

    def runtimes(self) -> list[str]:
        info = self._call("GET", "/info", "asking the engine for its runtimes") or {}
        return sorted((info.get("Runtimes") or {}).keys())

    def _version_fact(self, fact: str) -> str:
        """One field of the engine's ``/version`` (``Arch``, ``Version``, ``ApiVersion``), the
        call asked once per process for all of them; an odd or long value is cut to a short
        printable string (:func:`~runner.backends.types.engine_text`: the engine's word, never
        trusted for more than a record)."""
        key = (self._url, f"version:{fact}")
        known = transport.KNOWN.get(key)
        if known is None:
            # /version answers at once; /info walks every container and image first.
            answer = self._call("GET", "/version", "asking the engine about its host") or {}
            answer = answer if isinstance(answer, dict) else {}
            for name in ("Arch", "Version", "ApiVersion"):
                transport.KNOWN[(self._url, f"version:{name}")] = engine_text(answer.get(name))
            known = transport.KNOWN[key]
        return known

    def architecture(self) -> str:
        return self._version_fact("Arch")

    def engine(self) -> EngineInfo:
        return EngineInfo(
            self.ENGINE.lower(), self._version_fact("Version"), self._version_fact("ApiVersion")
        )

    def check_limits(self, limits: Limits) -> None:
        """Not checked: the runner's Docker hosts run it rootful, where every cap it is given
        is applied. (A rootless Docker on cgroup v1 would drop them, as rootless Podman does;
        ``runner.backends.podman`` is the backend that checks.)"""
        del limits

    def create(self, spec: ContainerSpec) -> str:
        lim = spec.limits
        host_config: dict[str, Any] = {
            "Mounts": [
                {
                    "Target": m.target,
                    "Source": str(m.source),
                    "Type": "bind",
                    "ReadOnly": m.read_only,
                }
                for m in spec.mounts
            ],
            "NetworkMode": spec.network or lim.network,
            "ReadonlyRootfs": lim.read_only_rootfs,
            "Tmpfs": {"/tmp": f"rw,nosuid,nodev,size={lim.tmpfs_bytes}"},  # noqa: S108 - in the box
            "CapDrop": list(lim.cap_drop),
            "SecurityOpt": list(lim.security_opt),
            "Memory": lim.memory_bytes,
            "MemorySwap": lim.memory_swap_bytes,
            "NanoCpus": round(lim.cpus * 1e9),
            "ShmSize": lim.shm_bytes,
            "Init": lim.init,
            "LogConfig": {
                "Type": "json-file",
                "Config": {"max-size": str(spec.log_max_bytes), "max-file": str(spec.log_files)},
            },
            "Runtime": lim.runtime,
        }
        if lim.pids is not None:
            host_config["PidsLimit"] = lim.pids
        if lim.cap_add:
            host_config["CapAdd"] = list(lim.cap_add)
        if spec.dns:
            host_config["Dns"] = list(spec.dns)
        if spec.dns_options:
            host_config["DnsOptions"] = list(spec.dns_options)
        if spec.devices is not None and spec.devices.mode == "cdi-native":
            host_config["DeviceRequests"] = [
                {"Driver": "cdi", "DeviceIDs": list(spec.devices.cdi_devices)}
            ]
        elif spec.devices is not None:
            host_config["Devices"] = [
                {"PathOnHost": n.host_path, "PathInContainer": n.container_path,
                 "CgroupPermissions": n.permissions}
                for n in spec.devices.nodes
            ]  # fmt: skip
        elif spec.gpu_ids:
            host_config["DeviceRequests"] = [
                {
                    "Driver": "",
                    "Count": 0,
                    "DeviceIDs": list(spec.gpu_ids),
                    "Capabilities": [["gpu"]],
                    "Options": {},
                }
            ]
        config: dict[str, Any] = {
            "Image": spec.image,
            "Entrypoint": spec.entrypoint,
            "Cmd": spec.command,
            "User": spec.user,
            "WorkingDir": spec.working_dir,
            "Env": [f"{k}={v}" for k, v in spec.environment.items()],
            "Labels": spec.labels,
            "AttachStdin": False,
            "AttachStdout": False,
            "AttachStderr": False,
            "OpenStdin": False,
            "StdinOnce": False,
            "Tty": False,
            "HostConfig": host_config,
        }
        if spec.aliases and spec.network:
            config["NetworkingConfig"] = {
                "EndpointsConfig": {spec.network: {"Aliases": list(spec.aliases)}}
            }
        if spec.backstop is not None:
            config["Healthcheck"] = spec.backstop.healthcheck()
        action = "creating the job container"
        try:
            created = self._call(
                "POST", "/containers/create", action, query={"name": spec.name}, body=config
            )
        except _NotFound as exc:
            raise InfrastructureError(f"{action}: {exc.message}") from exc
        container_id = str(created["Id"])
        for network in spec.extra_networks:  # one network at create on API 1.41: the rest now
            try:
                self._call(
                    "POST",
                    f"/networks/{quote(network, safe='')}/connect",
                    f"connecting {spec.name} to the network {network}",
                    body={"Container": container_id},
                )
            except (_NotFound, InfrastructureError) as exc:
                self.remove(container_id)
                if isinstance(exc, _NotFound):
                    raise InfrastructureError(
                        f"{action}: the network {network} does not exist",
                        hint=f"create it (`docker network create {network}`) or name another "
                        "in the host policy",
                    ) from exc
                raise
        return container_id

    def start(self, container_id: str) -> None:
        # 304: already started, which is the goal.
        try:
            self._container_call("POST", container_id, "/start", "starting the job container")
        except InfrastructureError as exc:
            # A device request the engine accepted at create but cannot honour: no NVIDIA
            # runtime or driver ("could not select device driver", nvidia-container-cli).
            if type(exc) is InfrastructureError and _GPU_START_ERROR.search(exc.message):
                cdi = '"cdi"' in exc.message  # a CDI request to an engine without CDI
                raise GpuUnavailable(
                    exc.message,
                    hint="turn on the engine's CDI support (Docker 25+: the cdi feature)"
                    if cdi
                    else "install the NVIDIA driver and container toolkit on this host, or "
                    "run the job on a GPU host",
                ) from exc
            raise

    def wait(self, container_id: str, timeout: float) -> int | None:
        action = "waiting for the job container"
        path = f"{self._version_prefix(action)}/containers/{quote(container_id)}/wait"
        answer = self._kept_answer(container_id, path, timeout, action)
        if answer is None:
            return None  # it still runs: the request stays, and says when it ends
        try:
            result = self._decoded(*answer, action)
        except _NotFound as exc:
            raise ContainerVanished(
                f"{action}: container {container_id[:12]} no longer exists "
                "(removed by someone else, or the engine lost it)",
            ) from exc
        return int((result or {}).get("StatusCode", -1))

    def stop(self, container_id: str, grace: float) -> None:
        seconds = max(round(grace), 0)
        self._container_call(
            "POST",
            container_id,
            "/stop",
            "stopping the job container",
            query={"t": seconds},
            timeout=self._timeout + seconds,
        )

    def kill(self, container_id: str) -> None:
        # 409: not running any more, which is the goal.
        self._container_call("POST", container_id, "/kill", "killing the job container", ok=(409,))

    def state(self, container_id: str) -> ContainerState:
        data: dict[str, Any] = self._container_call(
            "GET", container_id, "/json", "inspecting the job container"
        )
        return ContainerState.from_engine(data.get("State") or {}, str(data.get("Id", "")))

    def oom_logged(self, container_id: str, since: float) -> bool:
        found = False

        def read(response: http.client.HTTPResponse) -> None:
            nonlocal found
            read_so_far = 0  # a container's oom events, one JSON object a line: a few
            while not found and read_so_far < OOM_EVENTS_MAX_BYTES:
                line = response.readline(OOM_EVENTS_MAX_BYTES)
                if not line:
                    break
                read_so_far += len(line)
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    found = isinstance(event, dict) and event.get("status") == "oom"

        filters = {"type": ["container"], "container": [container_id], "event": ["oom"]}
        query = {
            "since": f"{since:.6f}",
            "until": f"{clock.now().timestamp():.6f}",
            "filters": json.dumps(filters),
        }
        self._call("GET", "/events", "reading the engine's events", query=query, stream_to=read)
        return found

    def save_logs(
        self, container_id: str, dest: Path, max_bytes: int, since: float | None = None
    ) -> int:
        pieces: list[bytes] = []
        written = 0

        def demultiplex(response: http.client.HTTPResponse) -> None:
            # No TTY: frames of an 8-byte header (stream, 0, 0, 0, big-endian length), then
            # the bytes; stdout and stderr interleaved in the order the engine logged them.
            nonlocal written
            while written < max_bytes:
                header = response.read(8)
                if len(header) < 8:
                    break
                (length,) = struct.unpack(">I", header[4:])
                chunk = response.read(length)[: max_bytes - written]
                pieces.append(chunk)
                written += len(chunk)

        self._container_call(
            "GET",
            container_id,
            "/logs",
            "reading the container's engine log",
            query={"stdout": 1, "stderr": 1, "timestamps": 1, "follow": 0}
            | ({"since": f"{since:.6f}"} if since is not None else {}),
            stream_to=demultiplex,
        )
        # Written after the transfer, so that a local write error is not taken for the
        # engine's (it is at most max_bytes, the runner's cap on the engine log).
        try:
            dest.write_bytes(b"".join(pieces))
        except OSError as exc:
            raise InfrastructureError(
                f"saving the container's engine log to {dest}: {exc}"
            ) from exc
        return written

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
        def demultiplex(response: http.client.HTTPResponse) -> None:
            while True:  # frames as in save_logs; each frame's bytes to the sink, in order
                header = response.read(8)
                if len(header) < 8:
                    return
                (length,) = struct.unpack(">I", header[4:])
                chunk = response.read(length)
                if chunk:
                    sink(chunk)
                if len(chunk) < length:
                    return

        def opened(conn: http.client.HTTPConnection) -> None:
            if handle is not None:
                handle.bind(transport.shut(conn))

        query = {"stdout": int(stdout), "stderr": int(stderr), "follow": int(follow)}
        try:
            self._container_call(
                "GET",
                container_id,
                "/logs",
                "following the container's engine log",
                query=query | ({"since": f"{since:.6f}"} if since is not None else {}),
                stream_to=demultiplex,
                opened=opened,
                timeout=_NO_TIMEOUT if follow else None,
            )
        except EngineUnavailable:
            if handle is not None and handle.cancelled:
                return  # closed on purpose
            raise

    def follow_stats(
        self,
        container_id: str,
        sink: Callable[[StatsSample], None],
        handle: LogFollow | None = None,
    ) -> None:
        self._follow_stats(
            self._version_prefix("reading the container's resource counters")
            + f"/containers/{quote(container_id)}/stats?stream=1",
            parse_stats,
            container_id,
            sink,
            handle,
        )

    def _follow_stats(
        self,
        url: str,
        parse: Callable[[bytes], StatsSample | None],
        container_id: str,
        sink: Callable[[StatsSample], None],
        handle: LogFollow | None,
    ) -> None:
        """Follow a stats stream of one JSON answer a line (each at most
        :data:`~runner.backends.stats.STATS_LINE_MAX`), ``parse`` making figures of each."""
        action = "reading the container's resource counters"

        def lines(response: http.client.HTTPResponse) -> None:
            while True:  # about one answer a second
                line = response.readline(STATS_LINE_MAX + 1)
                if not line or len(line) > STATS_LINE_MAX:
                    return  # ended, or no engine's answer: read no further
                sample = parse(line)
                if sample is None:
                    return  # the zero answer: the container is no longer running
                sink(sample)

        def opened(conn: http.client.HTTPConnection) -> None:
            if handle is not None:
                handle.bind(transport.shut(conn))

        try:
            status, _, _ = self._exchange(
                "GET", url, None, _NO_TIMEOUT, action, stream_to=lines, opened=opened
            )
        except EngineUnavailable:
            if handle is not None and handle.cancelled:
                return  # closed on purpose
            raise
        if status == 404:
            raise ContainerVanished(f"{action}: container {container_id[:12]} no longer exists")
        if status >= 400:
            raise InfrastructureError(f"{action}: the engine answered {status}")

    def remove(self, container_id: str) -> None:
        self._waits.drop(container_id)
        # 404: already gone; 409: removal already in progress. Both are the goal.
        with contextlib.suppress(ContainerVanished):
            self._container_call(
                "DELETE",
                container_id,
                "",
                "removing the job container",
                query={"force": 1, "v": 1},
                ok=(409,),
            )

    def find(self, labels: dict[str, str]) -> list[ContainerSummary]:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        found = (
            self._call(
                "GET",
                "/containers/json",
                "listing containers",
                query={"all": 1, "filters": json.dumps(filters)},
            )
            or []
        )
        return [
            ContainerSummary(
                id=str(c["Id"]),
                name=str((c.get("Names") or ["/?"])[0]).lstrip("/"),
                status=str(c.get("State", "")),
                labels=dict(c.get("Labels") or {}),
            )
            for c in found
        ]

    def create_network(self, name: str, labels: dict[str, str], *, internal: bool) -> NetworkInfo:
        action = f"creating the network {name}"
        body = {
            "Name": name,
            "CheckDuplicate": True,
            "Driver": "bridge",
            "Internal": internal,
            "Labels": labels,
            # No address of this host on an internal network's bridge: a route cut in the
            # container (the egress holder's) does not stop SO_DONTROUTE or a broadcast, and
            # the host answered on it to every service it runs on all addresses.
            "Options": {"com.docker.network.bridge.inhibit_ipv4": "true"} if internal else {},
        }
        try:
            created = self._call("POST", "/networks/create", action, body=body)
            data = self._call("GET", f"/networks/{quote(str(created['Id']))}", action)
        except _NotFound as exc:
            raise InfrastructureError(f"{action}: {exc.message}") from exc
        configs = (data.get("IPAM") or {}).get("Config") or []
        ipv4 = [c for c in configs if "." in c.get("Subnet", "")]
        if not ipv4 or not ipv4[0].get("Gateway"):
            self.remove_network(name)
            raise InfrastructureError(f"{action}: the engine gave it no IPv4 subnet and gateway")
        return NetworkInfo(str(data["Id"]), name, str(ipv4[0]["Subnet"]), str(ipv4[0]["Gateway"]))

    def remove_network(self, name: str) -> None:
        with contextlib.suppress(_NotFound):  # already gone: the goal
            path = f"/networks/{quote(name, safe='')}"
            self._call("DELETE", path, f"removing the network {name}")

    def find_networks(self, labels: dict[str, str]) -> list[NetworkSummary]:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        found = self._call(
            "GET", "/networks", "listing networks", query={"filters": json.dumps(filters)}
        )
        return [
            NetworkSummary(str(n["Id"]), str(n["Name"]), dict(n.get("Labels") or {}))
            for n in found or []
        ]

    @contextlib.contextmanager
    def image_files(self, image_id: str, labels: dict[str, str]) -> Iterator[_ImageFiles]:
        action = f"reading the files of the image {image_id}"
        body = {
            "Image": image_id,
            "Entrypoint": ["/runner-image-files-never-started"],
            "Cmd": [],
            "Labels": {**labels, "org.runner.managed": "true", "org.runner.image-files": "true"},
            "NetworkDisabled": True,
            "HostConfig": {"NetworkMode": "none"},
        }
        name = f"runner-image-files-{os.urandom(6).hex()}"
        try:
            created = self._call(
                "POST", "/containers/create", action, query={"name": name}, body=body
            )
        except _NotFound as exc:
            raise InfrastructureError(f"{action}: {exc.message}") from exc
        container_id = str(created["Id"])
        try:
            yield _ImageFiles(self, container_id, action)
        finally:
            self.remove(container_id)


class _ImageFiles:
    """:class:`~runner.backends.base.ImageFiles` of a created (never started) container."""

    def __init__(self, engine: DockerBackend, container_id: str, action: str) -> None:
        self._engine = engine
        self._path = f"/containers/{quote(container_id)}/archive"
        self._action = action

    def _url(self, path: str) -> str:
        return (
            self._engine._version_prefix(self._action)
            + self._path
            + "?"
            + urlencode({"path": path})
        )

    def stat(self, path: str) -> PathStat | None:
        status, headers, _ = self._engine._exchange(
            "HEAD", self._url(path), None, self._engine._timeout, self._action
        )
        if status == 404:
            return None
        if status >= 400:
            raise InfrastructureError(f"{self._action}: the engine answered {status} for {path}")
        raw = headers.get("X-Docker-Container-Path-Stat") or ""
        try:
            info = json.loads(base64.b64decode(raw))
            return PathStat(path, int(info["size"]), int(info["mode"]), str(info["linkTarget"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise InfrastructureError(
                f"{self._action}: the engine's stat of {path} is unreadable ({exc})"
            ) from None

    def archive(self, path: str, dest: Path, max_bytes: int) -> None:
        def copy(response: http.client.HTTPResponse) -> None:
            written = 0
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(dest, flags, 0o600), "wb") as out:
                while chunk := response.read(1024 * 1024):
                    written += len(chunk)
                    if written > max_bytes:
                        raise _TooLarge
                    out.write(chunk)

        try:
            status, _, data = self._engine._exchange(
                "GET", self._url(path), None, None, self._action, stream_to=copy
            )
        except _TooLarge:
            dest.unlink(missing_ok=True)
            raise InfrastructureError(
                f"{self._action}: {path} is more than {max_bytes:,} bytes as an archive",
                hint="declare smaller runtime paths, or raise the cap",
            ) from None
        except BaseException:
            dest.unlink(missing_ok=True)
            raise
        if status >= 400:
            message = data.decode(errors="replace").strip()[:300]
            raise InfrastructureError(
                f"{self._action}: the engine answered {status} for {path}: {message}"
            )


class _TooLarge(Exception):
    pass
