"""The job directory: where a job's inputs, outputs and records live on the host.

Layout of ``<state>/jobs/<job id>/``::

    input/          the contract's inputs (paper, repository), task.json, parser-catalog.json,
                    result.schema.json, compute-decision.json; mounted read-only
    output/         the job's evidence, stdout and stderr; mounted read-write
    workspace/      the job's working copy of the repository and its scratch; read-write
    runtime-cache/  caches the job keeps across its attempts; read-write
    runtime-venv/   the job's own Python environment, kept across attempts; read-write
    assets/         datasets and checkpoints; mounted read-only
    execution/      runner-owned files the job may read (runtime-budget.json, input-manifest.json);
                    mounted read-only
    record/         runner-owned, never mounted: the ledger, the lock (and owner.json: who holds
                    it, :meth:`JobDir.owner_pid`), earlier envelopes and
                    attempts/<n>/ (each attempt's container state, engine log, output manifest
                    and, once a later attempt starts, its stdout and stderr); replays.json
                    (`runner replay`'s report, earlier ones as replays-<time>.json) of a job
                    replayed, replay-of.json (the job it replays) of a replay
    result.json     the result envelope, written last and atomically
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.core import hostid, locks
from runner.core.errors import JobBusy
from runner.core.safefs import UnsafePath, open_regular
from runner.state.ledger import Budget

__all__ = ["JobDir", "StateDir", "atomic_write", "holding", "write_json"]


@dataclass(frozen=True)
class JobDir:
    root: Path

    @property
    def input(self) -> Path:
        return self.root / "input"

    @property
    def output(self) -> Path:
        return self.root / "output"

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def execution(self) -> Path:
        return self.root / "execution"

    @property
    def runtime_cache(self) -> Path:
        return self.root / "runtime-cache"

    @property
    def runtime_venv(self) -> Path:
        return self.root / "runtime-venv"

    @property
    def assets(self) -> Path:
        return self.root / "assets"

    @property
    def writable(self) -> tuple[Path, ...]:
        """The folders the job writes, all counted in its disk quota."""
        return (self.output, self.workspace, self.runtime_cache, self.runtime_venv)

    def attempt_record(self, n: int) -> Path:
        """``record/attempts/<n>/``: what the runner kept of attempt ``n``."""
        return self.record / "attempts" / str(n)

    @property
    def record(self) -> Path:
        return self.root / "record"

    @property
    def envelope(self) -> Path:
        return self.root / "result.json"

    @property
    def budget_file(self) -> Path:
        """``execution/runtime-budget.json``: what the job reads of its budget."""
        return self.execution / "runtime-budget.json"

    def write_budget(self, budget: Budget, *, durable: bool = True) -> None:
        """Write runtime-budget.json (atomically; the job reads it read-only). ``durable=False``
        where a runner is watching the job: the file is a view of the ledger (which is
        fsynced), rewritten before every attempt and at every heartbeat, and after a host
        crash no container of this host is running to read it."""
        data = {"schemaVersion": "1.0", **budget.as_json()}
        write_json(self.budget_file, data, durable=durable)

    @property
    def ledger(self) -> Path:
        """``record/ledger.jsonl``: the job's budget ledger."""
        return self.record / "ledger.jsonl"

    @property
    def lock(self) -> Path:
        """``record/lock``: held (``flock``) by the one runner running the job."""
        return self.record / "lock"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One runner per job directory at a time: a second is refused, never run beside it."""
        # Onlookers (runner cleanup, the GPU allocator) probe the lock for an instant:
        # wait out such a probe rather than mistake it for another runner.
        # The owner's alone (0600): a lock others may read is one any local user may hold.
        opener = locks.open_private_lock_file
        with locks.flocked(self.lock, timeout=2.0, poll=0.1, opener=opener, parents=False) as got:
            if not got:
                raise JobBusy(
                    f"job {self.root.name} is being run by another runner on this host right now",
                    hint="wait for it to finish, or give this run another --job-id",
                )
            # Who holds it, for a Slurm batch step whose `runner run` client died while a
            # served runner runs on (runner.scheduling.slurm.step) and for the Epilog.
            write_json(self.owner, _me(), durable=False)
            _HELD.add(self.root)
            try:
                yield
            finally:
                _HELD.discard(self.root)

    @property
    def owner(self) -> Path:
        """``record/owner.json``: the process that holds (or last held) the job's lock."""
        return self.record / "owner.json"

    def _owner_record(self) -> dict[str, Any] | None:
        try:
            with open_regular(self.owner) as f:
                raw = f.read(OWNER_MAX_BYTES + 1)
            data = json.loads(raw) if len(raw) <= OWNER_MAX_BYTES else None
        except (OSError, ValueError, UnsafePath):
            return None
        return data if isinstance(data, dict) else None

    def owner_elsewhere(self) -> str | None:
        """The host named in owner.json when someone holds the job's lock and owner.json says
        it is a runner of another host (the lock is shared through the state folder's
        storage); None otherwise."""
        if not locks.is_held(self.lock):
            return None
        data = self._owner_record()
        host = data.get("host") if data is not None else None
        name = host.get("name") if isinstance(host, dict) else None
        if not isinstance(name, str) or name == hostid.name():
            return None
        return name[:64]

    def owner_pid(self) -> int | None:
        """The process on this host that holds the job's lock right now, or None: the lock is
        free, or held from another host or by a process that owner.json does not name (its
        pid, the kernel's boot id and the process's start time must all match, so that a pid
        used again is never taken for the owner)."""
        if not locks.is_held(self.lock):
            return None
        data = self._owner_record()
        if data is None:
            return None
        pid, host = data.get("pid"), data.get("host")
        if type(pid) is not int or pid <= 1 or not isinstance(host, dict):
            return None
        if host.get("bootId") != hostid.identity()["bootId"] or host.get("name") != hostid.name():
            return None
        started = _start_ticks(pid)
        if started is None or started != data.get("startTicks"):
            return None
        return pid


_HELD: set[Path] = set()
"""The job folders whose lock this process holds now (:func:`holding`)."""


def holding() -> bool:
    """Whether this process holds any job's lock right now (a served runner whose client went
    away asks: before it owns a job, nothing would keep a Slurm batch step waiting for it)."""
    return bool(_HELD)


OWNER_MAX_BYTES = 4096
"""The most of owner.json read back."""


def _start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat field 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return None
    fields = raw.rpartition(b")")[2].split()  # after the command name, which may hold spaces
    value = fields[19] if len(fields) > 19 else b""
    return int(value) if value.isdigit() else None


def _me() -> dict[str, Any]:
    return {"pid": os.getpid(), "startTicks": _start_ticks(os.getpid()), "host": hostid.identity()}


@dataclass(frozen=True)
class StateDir:
    """The runner's state folder: ``jobs/<job id>/`` and ``gpu-locks/``."""

    root: Path

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    def job(self, job_id: str) -> JobDir:
        return JobDir(self.jobs / job_id)

    @property
    def gpu_locks(self) -> Path:
        return self.root / "gpu-locks"


def atomic_write(path: Path, data: bytes, mode: int = 0o644, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half.

    ``durable`` (the default) fsyncs the data before the rename, so that a host crash leaves
    the old file or the new one too. Without it a host crash (never a runner's crash: the
    page cache outlives the process) may leave the file empty: only for files that are
    superseded by a durable write before anything relies on them, or that readers already
    treat as missing when they cannot be parsed (a cache's bookkeeping), each said where
    it is written."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, value: Any, *, durable: bool = True) -> None:
    data = (json.dumps(value, indent=2, sort_keys=False) + "\n").encode()
    atomic_write(path, data, durable=durable)
