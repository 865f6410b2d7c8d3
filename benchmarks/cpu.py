"""Where a measured run's CPU went: the processes it started, the engine's daemons, the rest.

A wall-time ratio says that the runner is slower than ``docker run``, not why. On a machine of
two cores, twenty jobs at once are bound by CPU, so each figure of jobs at once also says who
spent the CPU seconds during its timed window (issue #29: "say where each remaining
millisecond goes"):

- ``own``: the processes the run started and reaped (``RUSAGE_CHILDREN``: `runner run`, its
  forks, or the `docker` CLI), plus, for a served run, the server and the forks it reaped;
- ``engine``: the engine's daemons, ``dockerd`` and ``containerd``, read from the kernel's
  counters of their processes;
- ``machine``: every core's busy time (all but idle and I/O wait);
- ``rest``: ``machine`` less both: containerd's per-container shims, runc, the job's own
  processes, the kernel's threads, and whatever else ran (on a shared machine, others' work).
"""

from __future__ import annotations

import contextlib
import resource
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import psutil

ENGINE_DAEMONS = ("dockerd", "containerd")
SETTLE_SECONDS = 5.0
"""The most a served run's window waits for the server to reap its forks (it reaps them at
least once a second), so that their CPU is in the server's children's counters."""


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds spent during one window, by whom (see the module's docstring)."""

    own: float
    engine: float
    machine: float

    @property
    def rest(self) -> float:
        return max(self.machine - self.own - self.engine, 0.0)


class CpuMeter:
    """Reads the counters before and after a window; ``server`` is a `runner serve` pid
    whose own and reaped children's CPU count as the run's own."""

    def __init__(self, server: int | None = None) -> None:
        self._engine = [
            p for p in psutil.process_iter(["name"]) if p.info["name"] in ENGINE_DAEMONS
        ]
        self._server = psutil.Process(server) if server is not None else None

    def _own(self) -> float:
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        own = kids.ru_utime + kids.ru_stime
        if self._server is not None:
            t = self._server.cpu_times()
            own += t.user + t.system + t.children_user + t.children_system
        return own

    def _engine_cpu(self) -> dict[int, float]:
        """Each engine daemon's CPU seconds so far, by pid (one gone or restarted since the
        meter was made is left out: only pids read at both ends are counted)."""
        seen: dict[int, float] = {}
        for p in self._engine:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                seen[p.pid] = t.user + t.system
        return seen

    @staticmethod
    def _machine() -> float:
        m = psutil.cpu_times()
        return m.user + m.nice + m.system + m.irq + m.softirq + m.steal

    def engine_pids(self) -> list[int]:
        """The engine daemons' pids, as found when the meter was made."""
        return [p.pid for p in self._engine]

    def _settle(self) -> None:
        if self._server is None:
            return
        deadline = time.monotonic() + SETTLE_SECONDS
        with contextlib.suppress(psutil.Error):
            while self._server.children() and time.monotonic() < deadline:
                time.sleep(0.02)

    @contextlib.contextmanager
    def window(self, uses: list[CpuUse]) -> Iterator[None]:
        """Measure the block; its :class:`CpuUse` is appended to ``uses``. The engine's and
        the machine's counters are read when the block ends, the run's own once a server
        has reaped its forks (their CPU was spent within the block)."""
        own0, engine0, machine0 = self._own(), self._engine_cpu(), self._machine()
        yield
        engine1, machine1 = self._engine_cpu(), self._machine()
        self._settle()
        engine = sum(engine1[pid] - engine0[pid] for pid in engine1.keys() & engine0.keys())
        uses.append(CpuUse(self._own() - own0, engine, machine1 - machine0))


def per_job(uses: Sequence[CpuUse], jobs: int) -> dict[str, float]:
    """The medians over ``uses`` of each share, per job, in seconds."""
    if not uses:
        return {}
    return {
        name: round(statistics.median(getattr(u, name) for u in uses) / jobs, 4)
        for name in ("own", "engine", "rest", "machine")
    }


def note(runner: dict[str, float], baseline: dict[str, float], own_name: str) -> str:
    """One line comparing the per-job shares of the runner's runs and the baseline's."""
    if not runner or not baseline:
        return "CPU a job: not measured"
    return (
        f"CPU a job (medians): {own_name} {runner['own']:.3f} s against the `docker` CLI's "
        f"{baseline['own']:.3f} s; the engine (dockerd, containerd) {runner['engine']:.3f} s "
        f"against {baseline['engine']:.3f} s; the rest (shims, runc, the job, the kernel) "
        f"{runner['rest']:.3f} s against {baseline['rest']:.3f} s; every core "
        f"{runner['machine']:.3f} s against {baseline['machine']:.3f} s"
    )
