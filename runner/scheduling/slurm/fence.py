"""Slurm as a takeover asks it about the job an earlier attempt ran in: every `runner run`
passes one (:class:`SlurmFence`), and almost none asks it anything, so the Slurm commands
(``cluster``, with the batch job it reads back) are imported on the first question, not
on every start (about 5 ms of each, and of each job a server or a batch forks)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.core.errors import InfrastructureError

if TYPE_CHECKING:
    from runner.scheduling.slurm.cluster import Cluster

__all__ = ["FENCE_COMMAND_TIMEOUT_SECONDS", "FENCE_EPILOG_SECONDS", "SlurmFence"]

FENCE_COMMAND_TIMEOUT_SECONDS = 20
"""A takeover's questions to Slurm: one that does not answer in time cannot tell."""

FENCE_EPILOG_SECONDS = 60
"""Allowed beyond Slurm's KillWait for a cancelled job to end: its Epilog (which stops what
a killed runner left, ``scripts/slurm-epilog.sh``) and slurmctld noting the end."""


class SlurmFence:
    """Slurm as a takeover asks it about the job an earlier attempt ran in (the seam
    ``runner.execution.takeover.Scheduler``; `runner run` passes one): the job's state from
    ``scontrol`` / ``sacct`` / the jobcomp file, ``scancel``, and how long a cancelled job may
    take to end (KillWait + :data:`FENCE_EPILOG_SECONDS`). Ids are ASCII digits only."""

    def __init__(self, cluster: Cluster | None = None) -> None:
        self._cluster = cluster

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            from runner.scheduling.slurm.cluster import Cluster

            self._cluster = Cluster(timeout=FENCE_COMMAND_TIMEOUT_SECONDS)
        return self._cluster

    def job(self, job_id: str) -> tuple[str, bool] | None:
        if not (job_id.isascii() and job_id.isdigit()):
            return None
        try:
            info = self.cluster.job(job_id)
        except InfrastructureError:  # no Slurm here, or it does not answer: it cannot tell
            return None
        except (ValueError, LookupError):  # an answer read wrong: it cannot tell either
            return None
        if info is None or not info.known:  # a blank, odd or forged state: it cannot tell
            return None
        return info.state[:32], info.ended

    def cancel(self, job_id: str) -> None:
        if not (job_id.isascii() and job_id.isdigit()):
            raise InfrastructureError(f"not a Slurm job id: {job_id!r}")
        self.cluster.cancel(job_id)

    def end_wait_seconds(self) -> float:
        try:
            kill_wait = self.cluster.kill_wait()
        except InfrastructureError:
            kill_wait = 30
        return float(kill_wait + FENCE_EPILOG_SECONDS)
