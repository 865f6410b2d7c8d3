"""The seventeenth hostile review, its Slurm part: the GPUs Slurm gave a job, and Slurm's
answers about a job read the wrong way.

- Under Slurm the runner handed its container any GPU of the node its own locks showed free,
  not those Slurm gave the job: nothing read ``SLURM_JOB_GPUS``, ``SLURM_STEP_GPUS`` or
  ``CUDA_VISIBLE_DEVICES``, and the plan's check compared only the count. The engine's daemon
  makes the container outside the Slurm job's cgroup, so even ConstrainDevices did not keep it
  off another job's GPU (``SLURM_JOB_GPUS=2`` on a four-GPU node got GPU 0).
- ``scontrol -o`` prints the owner's free text (``--comment``) after ``JobState``, and the last
  ``Key=`` of a line won: ``--comment="x JobState=COMPLETED"`` made a running job read as
  ended, so a takeover skipped cancelling it. The job's name comes before ``JobState``, so
  the first ``Key=`` winning is not enough on its own either.
- A blank state from ``sacct`` (``123| |0:0``) raised IndexError, which the takeover's fence
  did not catch: an internal error instead of "Slurm cannot tell".
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.backends.fake import FakeBackend, FakeJob
from runner.core.errors import GpuUnavailable, InfrastructureError
from runner.gpu.gpus import Gpu
from runner.planning import allocation
from runner.scheduling import submissions
from runner.scheduling.slurm.cluster import Cluster, check_end, parse_fields
from runner.scheduling.slurm.fence import SlurmFence
from runner.state.jobdir import StateDir
from runner.state.ledger import read_state
from tests.unit.test_orchestrator_fake import (
    _contract,
    _image,
    _no_fallback,
    _options,
    _run,
    _writes,
)

FOUR = [Gpu(i, f"GPU-fake-{i}", "Fake H200", 141 * 1024**3, "580.0") for i in range(4)]


class _FourGpus:
    def detect(self) -> list[Gpu]:
        return list(FOUR)


@pytest.fixture
def no_slurm(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in ("SLURM_JOB_ID", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch


def _slurm(**env: str) -> dict[str, str]:
    return {"SLURM_JOB_ID": "4242", "SLURM_GPUS_ON_NODE": "1", **env}


def test_a_slurm_job_given_gpu_2_hands_its_container_gpu_2(
    tmp_path: Path, no_slurm: pytest.MonkeyPatch, virtual_clock: Any
) -> None:
    """Slurm gave the job GPU 2 of four; the runner handed its container GPU 0 (the first its
    own locks showed free), which Slurm may have given another job."""
    fake = FakeBackend(jobs=FakeJob(work=_writes()))
    fake.add_image()
    fake.gpus = True
    env = _slurm(SLURM_JOB_GPUS="2", CUDA_VISIBLE_DEVICES="0", SLURM_CPUS_ON_NODE="4")
    for k, v in env.items():
        no_slurm.setenv(k, v)
    contract = _contract(tmp_path, _image(fake), gpu=1)
    opts = _options(tmp_path, gpu_detector=_FourGpus(), gpu_lock_dir=tmp_path / "locks",
                    policy={"maxima": {"gpus": 8}})  # fmt: skip
    envelope = _run(contract, opts, fake)
    assert envelope["status"] == "succeeded", envelope.get("failure")
    st = read_state(Path(envelope["jobDir"]) / "record" / "ledger.jsonl")
    assert [g["uuid"] for g in st.attempts[0].starting["gpus"]] == ["GPU-fake-2"]


def test_a_slurm_job_whose_gpus_cannot_be_mapped_is_refused_naming_the_variables(
    tmp_path: Path, no_slurm: pytest.MonkeyPatch, virtual_clock: Any
) -> None:
    """A Slurm GPU ID no detected GPU has (here 7 on a four-GPU node) was not looked at: the
    job ran on GPU 0; it is refused, as gpu_unavailable naming SLURM_JOB_GPUS, before anything
    starts."""
    fake = FakeBackend(jobs=FakeJob(work=_writes()))
    fake.add_image()
    fake.gpus = True
    for k, v in _slurm(SLURM_JOB_GPUS="7", SLURM_CPUS_ON_NODE="4").items():
        no_slurm.setenv(k, v)
    contract = _contract(tmp_path, _image(fake), _no_fallback, gpu=1)
    opts = _options(tmp_path, gpu_detector=_FourGpus(), gpu_lock_dir=tmp_path / "locks",
                    policy={"maxima": {"gpus": 8}})  # fmt: skip
    envelope = _run(contract, opts, fake)
    failure = envelope.get("failure") or {}
    assert failure.get("category") == "gpu_unavailable"
    assert "SLURM_JOB_GPUS='7'" in failure.get("reason", "")
    assert fake.containers == {}  # refused before any container was created


def test_slurm_gpu_ids_name_device_minor_numbers_not_nvml_indices() -> None:
    """With ConstrainDevices, NVML in the job's cgroup sees only the given devices and counts
    them from 0; Slurm's IDs are global. ID 3 is the device whose minor number is 3 (before:
    no Slurm variable was read, and any device could be handed out)."""
    seen = [Gpu(0, "GPU-b", "H200", 1, "580", minor=3), Gpu(1, "GPU-a", "H200", 1, "580", minor=1)]
    got = allocation.slurm_gpus(_slurm(SLURM_JOB_GPUS="3"), seen, 1)
    assert got is not None and [g.uuid for g in got] == ["GPU-b"]
    step = _slurm(SLURM_JOB_GPUS="1,3", SLURM_STEP_GPUS="1", SLURM_GPUS_ON_NODE="2")
    got = allocation.slurm_gpus(step, seen, "all")
    assert got is not None and [g.uuid for g in got] == ["GPU-a"]  # the step's, not the job's


def test_uuids_in_cuda_visible_devices_name_the_gpus() -> None:
    """UUIDs in CUDA_VISIBLE_DEVICES (a site's TaskProlog) name the GPUs exactly, whatever
    the IDs; before, they were ignored like every other Slurm variable."""
    env = _slurm(SLURM_JOB_GPUS="0", CUDA_VISIBLE_DEVICES="GPU-fake-3")
    got = allocation.slurm_gpus(env, FOUR, 1)
    assert got is not None and [g.uuid for g in got] == ["GPU-fake-3"]


@pytest.mark.parametrize(
    ("env", "want", "said"),
    [
        (_slurm(), 1, "SLURM_STEP_GPUS, SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES unset"),
        (_slurm(SLURM_JOB_GPUS="1"), 2, "asks for 2 GPUs and the Slurm job was given 1"),
        (_slurm(SLURM_JOB_GPUS="0-3"), 1, "SLURM_JOB_GPUS is not a list of Slurm GPU IDs"),
        (_slurm(SLURM_JOB_GPUS="1,1"), 1, "names a GPU twice"),
        (_slurm(SLURM_JOB_GPUS="9"), 1, "GPU 9, which none of this host's detected GPUs"),
        (_slurm(CUDA_VISIBLE_DEVICES="GPU-fake-1,2"), 1, "not a list of GPU UUIDs"),
        (_slurm(CUDA_VISIBLE_DEVICES="GPU-other"), 1, "GPU GPU-other, which none"),
    ],
)
def test_a_slurm_grant_that_cannot_be_used_is_refused(
    env: dict[str, str], want: int, said: str
) -> None:
    """Under Slurm, no GPU IDs, too few, IDs not understood or naming no detected GPU were
    never looked at (any free GPU of the node was handed out); each is refused, naming the
    variables, with the fix."""
    with pytest.raises(GpuUnavailable) as caught:
        allocation.slurm_gpus(env, FOUR, want)
    assert said in caught.value.message
    assert caught.value.hint and "CUDA_VISIBLE_DEVICES" in caught.value.hint


def test_outside_slurm_every_detected_gpu_may_be_handed_out() -> None:
    """Outside a Slurm job, the host's own locks decide, as before."""
    assert allocation.slurm_gpus({"CUDA_VISIBLE_DEVICES": "2"}, FOUR, 1) is None


class _Said(Cluster):
    def __init__(self, answers: dict[str, str]) -> None:
        super().__init__()
        self.answers = answers
        self.asked: list[list[str]] = []

    def _exec(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.asked.append(argv)
        return subprocess.CompletedProcess(argv, 0, self.answers.get(argv[0], ""), "")


RUNNING = "JobId=123 JobName=runner-x UserId=u(1) GroupId=g(1) JobState=RUNNING Reason=None "


def test_a_comment_cannot_make_a_running_job_read_as_ended() -> None:
    """``--comment="x JobState=COMPLETED"`` is printed after Slurm's JobState, and the last
    ``Key=`` won: a running job read as COMPLETED, so a takeover did not cancel it."""
    line = RUNNING + "Requeue=1 Comment=note JobState=COMPLETED Requeue=0\n"
    assert parse_fields(line)["JobState"] == "RUNNING"
    fence = SlurmFence(_Said({"scontrol": line, "squeue": "RUNNING\n"}))
    assert fence.job("123") == ("RUNNING", False)


def test_a_job_name_cannot_make_a_running_job_read_as_ended() -> None:
    """The job's name is printed before JobState, so its ``JobState=COMPLETED`` would win were
    the first key taken on trust: a line that says JobState twice is asked of squeue, which
    prints the state alone."""
    line = RUNNING.replace("JobName=runner-x", "JobName=x JobState=COMPLETED") + "Requeue=1\n"
    cluster = _Said({"scontrol": line, "squeue": "RUNNING\n"})
    assert SlurmFence(cluster).job("123") == ("RUNNING", False)
    assert cluster.asked[-1][0] == "squeue"
    odd = _Said({"scontrol": line, "squeue": "x JobState=COMPLETED\n"})
    assert SlurmFence(odd).job("123") is None  # squeue's answer is not a state: cannot tell


@pytest.mark.parametrize("state", [" ", "", "Completed", "COMPLETED\x1b[0m"])
def test_a_blank_or_odd_sacct_state_is_cannot_tell(state: str) -> None:
    """A blank sacct state (``123| |0:0``) raised IndexError through the fence (a takeover's
    internal error), and an empty or odd one read as an ended job; each is "cannot tell"."""
    cluster = _Said({"scontrol": "", "sacct": f"123|{state}|0:0\n"})
    info = cluster.job("123")
    assert info is not None and info.state == "UNKNOWN" and not info.known
    assert SlurmFence(cluster).job("123") is None


def test_the_fence_takes_a_malformed_answer_for_cannot_tell() -> None:
    """An answer the reading trips on (here a stand-in raising IndexError) was an internal
    error of the takeover; the fence says it cannot tell."""

    class _Broken(Cluster):
        def job(self, slurm_job: str) -> None:
            raise IndexError("list index out of range")

    assert SlurmFence(_Broken()).job("123") is None


def test_sacct_still_reads_a_state_with_its_cause() -> None:
    """``CANCELLED by 0`` is still CANCELLED (ended)."""
    cluster = _Said({"scontrol": "", "sacct": "123|CANCELLED by 0|0:15\n"})
    assert SlurmFence(cluster).job("123") == ("CANCELLED", True)


def test_job_wait_takes_a_state_it_cannot_read_for_slurm_not_answering(tmp_path: Path) -> None:
    """`runner job wait`'s look at a job whose sacct state is blank: it crashed (IndexError),
    and once the state read as UNKNOWN it was taken for the job's end. Now it is Slurm not
    answering, which `wait` asks again for a while."""
    submissions.append(tmp_path, "slurm", "j", {"slurmJobId": "123"})
    StateDir(tmp_path).job("j").record.mkdir(parents=True)
    with pytest.raises(InfrastructureError, match="names no state"):
        check_end(tmp_path, "j", _Said({"scontrol": "", "sacct": "123| |0:0\n"}))


def test_free_text_holding_requeue_cannot_make_a_preempted_job_read_as_ended() -> None:
    """A comment holding ``Requeue=1`` sent the record to squeue (a key twice), which prints
    no Requeue: a preempted job Slurm will run again read as ended, and a takeover skipped
    cancelling it. Requeue is now taken as set on that path: not ended."""
    line = (
        "JobId=77 JobName=runner-j1 UserId=u(1000) GroupId=g(1000) JobState=PREEMPTED "
        "Reason=None Requeue=1 Restarts=0 Comment=x Requeue=1 WorkDir=/home/u\n"
    )
    assert SlurmFence(_Said({"scontrol": line, "squeue": "PREEMPTED\n"})).job("77") == (
        "PREEMPTED",
        False,
    )
    honest = line.replace("Comment=x Requeue=1", "Comment=nightly")
    assert SlurmFence(_Said({"scontrol": honest})).job("77") == ("PREEMPTED", False)


def test_the_batch_script_imports_nothing_from_its_working_folder(tmp_path: Path) -> None:
    """The batch script's step runs ``python -m`` in the job's record folder, which ``-m`` puts
    first on ``sys.path``: a ``runner.py`` there would be imported instead of the runner. Both
    of its Python commands now run with ``-P``, as `runner serve`'s autostart does."""
    import sys
    import uuid

    from runner.scheduling.slurm import batch

    request = batch.Request(
        contract=str(tmp_path / "task.json"), contractSha256="ab" * 32,
        contractDigest="sha256:" + "ab" * 32, jobId="job-1", cpus=1, memMiB=512, gres=None,
        timeMinutes=5, budgetSeconds=60.0,
    )  # fmt: skip
    marker, token = tmp_path / "marker", uuid.uuid4().hex
    text = batch.batch_script(request, python=sys.executable, state=tmp_path, marker=marker,
                              token=token, run_args=[])  # fmt: skip
    assert text.count(" -P -m runner") == 2, text
    (tmp_path / "runner.py").write_text("raise SystemExit('the working folder was imported')\n")
    ran = subprocess.run([sys.executable, "-P", "-m", "runner", "--version"], cwd=tmp_path,
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert ran.returncode == 0 and "working folder" not in ran.stderr, ran.stderr
