"""The Docker engine backend: the only module that imports the docker SDK."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests
from docker.types import DeviceRequest, LogConfig
from docker.types import Mount as DockerMount

from runner.backends.base import ContainerSpec, ContainerState, ContainerSummary
from runner.errors import (
    ContainerVanished,
    EngineUnavailable,
    ImageUnavailable,
    InfrastructureError,
)
from runner.images import ImageInfo

_CONNECTION_ERRORS = (requests.exceptions.ConnectionError, requests.exceptions.Timeout)


@contextlib.contextmanager
def _engine(action: str, container_id: str | None = None) -> Iterator[None]:
    """Translate SDK and transport errors into the runner's error tree."""
    try:
        yield
    except docker.errors.NotFound as exc:
        if container_id is None:
            raise InfrastructureError(f"{action}: {exc.explanation or exc}") from exc
        raise ContainerVanished(
            f"{action}: container {container_id[:12]} no longer exists "
            "(removed by someone else, or the engine lost it)",
        ) from exc
    except docker.errors.APIError as exc:
        raise InfrastructureError(
            f"{action}: the engine answered {exc.status_code}: {exc.explanation or exc}"
        ) from exc
    except _CONNECTION_ERRORS as exc:
        raise EngineUnavailable(
            f"{action}: the Docker engine cannot be reached ({type(exc).__name__})",
            hint="start it (`scripts/setup.sh` does) and check DOCKER_HOST",
        ) from exc
    except docker.errors.DockerException as exc:
        raise EngineUnavailable(
            f"{action}: {exc}",
            hint="start the engine (`scripts/setup.sh` does) and check DOCKER_HOST",
        ) from exc


class DockerBackend:
    """Talks to the engine through the low-level API client."""

    def __init__(self, base_url: str | None = None, timeout: float = 60.0) -> None:
        with _engine("connecting to the engine"):
            if base_url:
                self._api = docker.APIClient(base_url=base_url, timeout=timeout)
            else:
                self._api = docker.from_env(timeout=timeout).api

    def ping(self) -> None:
        with _engine("pinging the engine"):
            self._api.ping()

    def inspect_image(self, reference: str) -> ImageInfo | None:
        try:
            with _engine(f"inspecting image {reference}"):
                data: dict[str, Any] = self._api.inspect_image(reference)
        except InfrastructureError as exc:
            if isinstance(exc.__cause__, docker.errors.NotFound):
                return None
            raise
        return ImageInfo(
            id=data["Id"],
            repo_digests=tuple(data.get("RepoDigests") or ()),
            repo_tags=tuple(data.get("RepoTags") or ()),
            architecture=data.get("Architecture", ""),
            os=data.get("Os", ""),
            size=int(data.get("Size") or 0),
        )

    def pull(
        self,
        reference: str,
        auth: dict[str, str] | None,
        on_progress: Callable[[dict[str, Any]], None],
    ) -> None:
        with _engine(f"pulling {reference}"):
            stream = self._api.pull(reference, stream=True, decode=True, auth_config=auth)
            for chunk in stream:
                if "error" in chunk or "errorDetail" in chunk:
                    detail = chunk.get("errorDetail") or {}
                    message = detail.get("message") or chunk.get("error") or str(chunk)
                    raise ImageUnavailable(
                        f"the engine could not pull {reference}: {message}",
                        hint="check the registry and the digest; `docker pull` shows the same",
                    )
                on_progress(chunk)

    def load(self, bundle: Path) -> None:
        with _engine(f"loading {bundle.name}"), bundle.open("rb") as data:
            for chunk in self._api.load_image(data, quiet=True):
                if "error" in chunk or "errorDetail" in chunk:
                    detail = chunk.get("errorDetail") or {}
                    message = detail.get("message") or chunk.get("error") or str(chunk)
                    raise ImageUnavailable(f"the engine could not load {bundle}: {message}")

    def gpu_capable(self) -> bool:
        """Whether the engine can hand NVIDIA GPUs to containers: an ``nvidia`` runtime, or the
        NVIDIA container toolkit's hook on the engine's host (this runner's engine is local)."""
        import shutil

        if "nvidia" in self.runtimes():
            return True
        return shutil.which("nvidia-container-runtime-hook") is not None

    def runtimes(self) -> list[str]:
        with _engine("asking the engine for its runtimes"):
            return sorted((self._api.info().get("Runtimes") or {}).keys())

    def architecture(self) -> str:
        # /version answers at once; /info walks every container and image first.
        with _engine("asking the engine about its host"):
            return str(self._api.version().get("Arch", ""))

    def create(self, spec: ContainerSpec) -> str:
        lim = spec.limits
        device_requests = None
        if spec.gpu_ids:
            device_requests = [DeviceRequest(device_ids=list(spec.gpu_ids), capabilities=[["gpu"]])]
        host_config = self._api.create_host_config(
            mounts=[
                DockerMount(m.target, str(m.source), type="bind", read_only=m.read_only)
                for m in spec.mounts
            ],
            network_mode=lim.network,
            read_only=lim.read_only_rootfs,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={lim.tmpfs_bytes}"},  # noqa: S108 - in the box
            cap_drop=list(lim.cap_drop),
            security_opt=list(lim.security_opt),
            mem_limit=lim.memory_bytes,
            memswap_limit=lim.memory_swap_bytes,
            nano_cpus=int(lim.cpus * 1e9),
            shm_size=lim.shm_bytes,
            pids_limit=lim.pids,
            init=lim.init,
            log_config=LogConfig(
                type="json-file", config={"max-size": str(spec.log_max_bytes), "max-file": "1"}
            ),
            device_requests=device_requests,
            runtime=lim.runtime,
        )
        with _engine("creating the job container"):
            created = self._api.create_container(
                image=spec.image,
                entrypoint=spec.entrypoint,
                command=spec.command,
                user=spec.user,
                working_dir=spec.working_dir,
                environment=spec.environment,
                labels=spec.labels,
                name=spec.name,
                host_config=host_config,
                stdin_open=False,
                tty=False,
            )
        return str(created["Id"])

    def start(self, container_id: str) -> None:
        with _engine("starting the job container", container_id):
            self._api.start(container_id)

    def wait(self, container_id: str, timeout: float) -> int | None:
        try:
            with _engine("waiting for the job container", container_id):
                result = self._api.wait(container_id, timeout=max(timeout, 0.01))
        except EngineUnavailable:
            # The SDK reports its own read timeout as a connection error; ask the engine.
            state = self.state(container_id)
            return None if state.running else state.exit_code
        return int(result.get("StatusCode", -1))

    def stop(self, container_id: str, grace: float) -> None:
        with _engine("stopping the job container", container_id):
            self._api.stop(container_id, timeout=max(round(grace), 0))

    def kill(self, container_id: str) -> None:
        with _engine("killing the job container", container_id):
            try:
                self._api.kill(container_id)
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: not running any more, which is the goal
                    raise

    def state(self, container_id: str) -> ContainerState:
        with _engine("inspecting the job container", container_id):
            data: dict[str, Any] = self._api.inspect_container(container_id)
        st: dict[str, Any] = data.get("State") or {}
        running = bool(st.get("Running"))
        return ContainerState(
            status=str(st.get("Status", "")),
            running=running,
            exit_code=None if running else int(st.get("ExitCode", -1)),
            oom_killed=bool(st.get("OOMKilled")),
            error=str(st.get("Error") or ""),
            started_at=st.get("StartedAt"),
            finished_at=st.get("FinishedAt"),
            raw=st,
            id=str(data.get("Id", "")),
        )

    def save_logs(self, container_id: str, dest: Path, max_bytes: int) -> int:
        written = 0
        with _engine("reading the container's engine log", container_id), dest.open("wb") as out:
            for chunk in self._api.logs(container_id, stream=True, follow=False, timestamps=True):
                room = max_bytes - written
                if room <= 0:
                    break
                out.write(chunk[:room])
                written += min(len(chunk), room)
        return written

    def remove(self, container_id: str) -> None:
        with _engine("removing the job container"):
            try:
                self._api.remove_container(container_id, force=True, v=True)
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: removal already in progress
                    raise

    def find(self, labels: dict[str, str]) -> list[ContainerSummary]:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        with _engine("listing containers"):
            found = self._api.containers(all=True, filters=filters)
        return [
            ContainerSummary(
                id=str(c["Id"]),
                name=str((c.get("Names") or ["/?"])[0]).lstrip("/"),
                status=str(c.get("State", "")),
                labels=dict(c.get("Labels") or {}),
            )
            for c in found
        ]
