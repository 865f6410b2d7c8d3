"""`runner job wait`'s end of a Slurm job (runner.scheduling.slurm.cluster.check_end) while a
runner still holds the job's lock: a Slurm job that has ended is not the job's end then (a
served runner whose batch step was ended from outside runs on). A fake of the Slurm commands
(their answers only); a real lock."""

from __future__ import annotations

from pathlib import Path

from runner.scheduling import submissions
from runner.scheduling.slurm.cluster import Cluster, JobInfo, check_end
from runner.state.jobdir import StateDir


class _Ended(Cluster):
    def job(self, slurm_job: str) -> JobInfo | None:
        return JobInfo("FAILED", {"JobId": slurm_job}, "scontrol")


def test_an_ended_slurm_job_is_no_end_while_a_runner_holds_the_job(tmp_path: Path) -> None:
    submissions.append(tmp_path, "slurm", "j", {"slurmJobId": "41"})
    job = StateDir(tmp_path).job("j")
    job.record.mkdir(parents=True)
    with job.locked():
        assert check_end(tmp_path, "j", _Ended()) is None, "its runner runs on: keep waiting"
    end = check_end(tmp_path, "j", _Ended())
    assert end is not None and end.slurm_state == "FAILED" and end.envelope is None
