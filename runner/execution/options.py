"""How a run is to be done on this host: the caller's settings, a frozen value."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from runner.contract import Trust
from runner.planning import policy
from runner.planning.policy import LoadedPolicy
from runner.staging.jobdir import InputRules
from runner.state.jobdir import StateDir

if TYPE_CHECKING:
    from runner.execution.takeover import Scheduler
    from runner.gpu import gpus, usage  # imported where a job uses it: a job without one never does

__all__ = ["RunOptions"]


def _default_policy() -> LoadedPolicy:
    return policy.load(None)


@dataclass(frozen=True)
class RunOptions:
    state_dir: Path
    job_id: str | None = None
    policy: LoadedPolicy = field(default_factory=_default_policy)
    trust: Trust = field(default_factory=lambda: Trust(keys=[]))
    labels: dict[str, str] = field(default_factory=dict)
    overrides: dict[str, float] = field(default_factory=dict)
    """Operator limits that tighten the contract's (``--limit``)."""
    rerun: bool = False
    """Run a finished job id again as a new attempt under the same budget."""
    stop_grace_seconds: float = 5.0
    tick_seconds: float = 0.2
    """How often the container, the deadline and the quotas are checked."""
    gpu_detector: gpus.Detector | None = None
    """How GPUs are found (NVML, else nvidia-smi); tests of pure logic pass their own."""
    cdi_dirs: tuple[Path, ...] | None = None
    """Where CDI specs are read from: ``/etc/cdi`` and ``/var/run/cdi`` by default."""
    gpu_lock_dir: Path | None = None
    """Where device locks live: ``$RUNNER_GPU_LOCK_DIR``, else the host-wide
    ``/run/lock/runner-gpus`` shared by every user's runner."""
    result_key: Path | None = None
    """The runner's own signing key; when set, result.intoto.json (SLSA provenance) and
    result.envelope.intoto.json are written beside the envelope (the key is made on first
    use)."""
    bundle: Path | None = None
    """A `docker save` tarball to load the pinned image from when it is not here."""
    heartbeat_seconds: float = 5.0
    """How often the ledger and runtime-budget.json are brought up to date while a job runs."""
    gpu_usage: Callable[[], usage.UsageReader] | None = None
    """What reads a GPU attempt's devices at each sample: NVML by default; tests pass a fake."""
    resource_sampling: bool = True
    """Follow the engine's stats of each attempt's container (``runner.execution.resources``):
    its figures in the envelope, its series in ``record/attempts/<n>/resources.json``. False:
    no stats stream is opened (``runner run --no-resource-sampling``)."""
    protected: tuple[Path, ...] = ()
    """The runner's own folders besides the state dir (config, keys): never staged."""
    replayed: Path | None = None
    """A replay's (``runner replay``): the replayed job's ``input/``, which its contract is read
    from and its inputs staged from though it lies in the state dir
    (:attr:`~runner.staging.jobdir.InputRules.replayed`)."""

    @property
    def state(self) -> StateDir:
        return StateDir(self.state_dir)

    lease: float | None = None
    """See :attr:`lease_seconds`; None: the default derived from the heartbeat."""
    scheduler: Scheduler | None = None
    """The cluster scheduler a takeover asks whether the earlier attempt's job still runs
    (`runner run` passes Slurm's: :class:`runner.scheduling.slurm.fence.SlurmFence`); None:
    the lease rule alone (:mod:`runner.execution.takeover`)."""

    @property
    def lease_seconds(self) -> float:
        """How long an attempt's runner may go without writing a heartbeat before it removes
        its own container (and, after another such lease, a runner on another host may take
        the job over): by default three heartbeats, never under 120 s, so a slow moment on a
        busy host (a disk-quota walk of a tree of millions of files, say: the watch loop
        writes the heartbeats between its checks) is not taken for a lost one."""
        return self.lease if self.lease is not None else max(3 * self.heartbeat_seconds, 120.0)

    def input_rules(self) -> InputRules:
        """The policy's caps on inputs; the runner's own folders (its state, its key's folder
        and the folders the caller names) are never staged."""
        pol = self.policy.policy
        own = [self.state_dir, *self.protected]
        if self.result_key is not None:
            own.append(self.result_key.parent)
        return InputRules.protecting(
            own,
            replayed=self.replayed,
            max_bytes=int(pol.maxInputMb * 1024 * 1024),
            max_files=pol.maxInputFiles,
        )
