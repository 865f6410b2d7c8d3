"""GPUs: what the host has, and handing each job its own devices.

Detection asks NVML (the ``nvidia-ml-py`` binding, the ``[gpu]`` extra), else ``nvidia-smi``;
with neither the host has no GPUs, and a GPU job's refusal says what to install. Allocation
writes one lock file per device (``<lock dir>/<uuid>.json``) naming the job that holds it, under
a host-wide allocation lock, so concurrent runners never hand the same device to two jobs. A
device's lock outlives a crashed runner while the job's container still runs; it is reclaimed
only when neither the holder's runner nor its container is alive.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from runner.core import locks
from runner.core.errors import GpuUnavailable

__all__ = [
    "HOST_LOCK_DIR",
    "Allocator",
    "Detector",
    "Gpu",
    "HostDetector",
    "none_found",
    "nvml_binding_installed",
    "parse_smi",
]


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    model: str
    memory_bytes: int
    driver_version: str
    minor: int | None = None
    """The device node's number (``/dev/nvidia<minor>``, NVML's minor number); None: unknown
    (nvidia-smi's report), taken to be the index."""

    @property
    def device_number(self) -> int:
        """The device node's number (``/dev/nvidia<N>``): the minor number, else the index."""
        return self.index if self.minor is None else self.minor


class Detector(Protocol):
    def detect(self) -> list[Gpu]:
        """The host's GPUs; an empty list when there are none (or no driver)."""
        ...


class HostDetector:
    """NVML, else nvidia-smi, else none."""

    def detect(self) -> list[Gpu]:
        found = self._nvml()
        if found is None:
            found = self._smi()
        return found or []

    @staticmethod
    def _nvml() -> list[Gpu] | None:
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            return None
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                out.append(
                    Gpu(
                        index=i,
                        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                        model=_text(pynvml.nvmlDeviceGetName(handle)),
                        memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                        driver_version=_text(driver),
                        minor=int(pynvml.nvmlDeviceGetMinorNumber(handle)),
                    )
                )
            return out
        except pynvml.NVMLError:
            return None
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()

    @staticmethod
    def _smi() -> list[Gpu] | None:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return None
        query = "index,uuid,name,memory.total,driver_version"
        try:
            proc = subprocess.run(
                [smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if proc.returncode != 0:
            return None
        return parse_smi(proc.stdout)


GPU_EXTRA = "pip install 'reproduction-runner[gpu]'"
"""How to install NVML's Python binding (``nvidia-ml-py``): the distribution's ``gpu`` extra."""


def nvml_binding_installed() -> bool:
    """Whether NVML's Python binding (``pynvml``, from ``nvidia-ml-py``) can be imported."""
    return importlib.util.find_spec("pynvml") is not None


def none_found() -> str:
    """Why detection found no GPU: with NVML's binding missing, that and how to install it
    (nvidia-smi, the fallback, found none either)."""
    if nvml_binding_installed():
        return "neither NVML nor nvidia-smi reports one"
    return f"nvidia-smi reports none and NVML's Python binding is not installed: {GPU_EXTRA}"


def _text(value: object) -> str:
    """NVML strings: ``str`` from nvidia-ml-py, ``bytes`` from older pynvml releases."""
    return value.decode() if isinstance(value, bytes) else str(value)


def parse_smi(text: str) -> list[Gpu]:
    """``nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version`` CSV (MiB)."""
    out = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        index, uuid, name, memory_mib, driver = parts
        out.append(Gpu(int(index), uuid, name, int(float(memory_mib)) * 1024**2, driver))
    return out


HOST_LOCK_DIR = Path("/run/lock/runner-gpus")
"""The default device-lock folder: one per host, shared by every user's runner (sticky and
world-writable, like /tmp), so two users are never handed the same GPU. Emptied at boot, with
the containers that held the devices."""


def _shared_folder(path: Path) -> None:
    """Create ``path`` for every user: mode 1777 (anyone may add a lock file, only its owner
    may remove it) when this user made it."""
    path.mkdir(parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != 0o1777:
        os.chmod(path, 0o1777)  # noqa: S103 - shared by every user, sticky like /tmp


def _open_shared(path: Path) -> int:
    """A lock file every user's runner can read and write (0666), never through a link."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    if os.fstat(fd).st_uid == os.geteuid():
        os.fchmod(fd, 0o666)
    return fd


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    _shared_folder(path.parent)
    with locks.flocked(path, opener=_open_shared, parents=False):
        yield


def _write_shared(path: Path, data: bytes) -> None:
    """Replace a lock file's content in place (under the ``.allocate`` lock): its owner may be
    another user, so it is rewritten rather than replaced."""
    fd = _open_shared(path)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, data)
    finally:
        os.close(fd)


Holder = dict[str, Any]


class Allocator:
    """Hands out devices by writing their lock files; ``is_alive(holder)`` says whether a
    holder (its runner or its container) still needs its devices."""

    def __init__(self, lock_dir: Path, is_alive: Callable[[Holder], bool]) -> None:
        self.lock_dir = lock_dir
        self.is_alive = is_alive

    def _holder(self, gpu: Gpu) -> Holder | None:
        path = self.lock_dir / f"{gpu.uuid}.json"
        try:
            text = path.read_text()
            data: Holder | None = json.loads(text) if text.strip() else None  # empty: free
        except (OSError, ValueError):
            return None
        return data

    def allocate(self, want: int | Literal["all"], host: list[Gpu], owner: Holder) -> list[Gpu]:
        """Lock ``want`` free devices for ``owner`` (a dict with ``jobDir``); raise
        GpuUnavailable when the host does not have that many free."""
        if not host:
            raise GpuUnavailable(
                f"the contract asks for GPUs and this host has none ({none_found()})",
                hint="run it on a GPU host, or issue it with computeRequirement."
                "cpuFallbackAllowed true if a CPU run is acceptable",
            )
        with _locked(self.lock_dir / ".allocate"):
            free = []
            for gpu in host:
                holder = self._holder(gpu)
                mine = holder is not None and holder.get("jobDir") == owner.get("jobDir")
                if holder is None or mine or not self.is_alive(holder):
                    free.append(gpu)
            count = len(host) if want == "all" else want
            if count > len(host):
                raise GpuUnavailable(
                    f"the contract asks for {count} GPUs and this host has {len(host)}",
                    hint="issue it for at most this many GPUs, or run it on a larger host",
                )
            if len(free) < count:
                error = GpuUnavailable(
                    f"{count} GPU(s) wanted, {len(free)} of {len(host)} free: the others are "
                    "held by running jobs",
                    hint="run it again when a job finishes (the budget is not charged)",
                )
                error.retryable = True
                raise error
            chosen = free[:count]
            for gpu in chosen:
                held = {**owner, "gpu": asdict(gpu), "pid": os.getpid(), "uid": os.geteuid()}
                _write_shared(self.lock_dir / f"{gpu.uuid}.json", json.dumps(held).encode())
            return chosen

    def release(self, job_dir: str) -> None:
        """Drop every device lock held by the job at ``job_dir``."""
        with _locked(self.lock_dir / ".allocate"):
            for path in self.lock_dir.glob("*.json"):
                try:
                    text = path.read_text()
                    holder = json.loads(text) if text.strip() else {}
                except (OSError, ValueError):
                    continue
                if holder.get("jobDir") == job_dir:
                    _write_shared(path, b"")  # free; the file stays, shared by every user

    def holders(self) -> dict[str, Holder]:
        """Devices held now, by UUID."""
        out = {}
        for path in self.lock_dir.glob("*.json"):
            try:
                text = path.read_text()
            except OSError:
                continue
            if text.strip():
                with contextlib.suppress(ValueError):
                    out[path.stem] = json.loads(text)
        return out
