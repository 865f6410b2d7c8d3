"""The Slurm commands a submitter needs (the CLI, not slurmrestd: every cluster has the CLI,
while the REST daemon needs JWT authentication set up), each with a timeout, and a job's state
read back from ``scontrol`` while slurmctld remembers the job (``MinJobAge``), else ``sacct``
where accounting runs, else the jobcomp file (``JobCompType=jobcomp/filetxt``)."""

from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.core import locks
from runner.core.errors import InfrastructureError, PolicyViolation
from runner.core.safefs import UnsafePath, open_regular
from runner.scheduling.slurm.batch import (
    last_submission,
    offered_gpu_types,
    record_dir,
    submission_of,
)

__all__ = [
    "MAX_ENVELOPE_BYTES",
    "Cluster",
    "Ended",
    "check_end",
    "describe",
    "parse_fields",
]

COMMAND_TIMEOUT_SECONDS = 60
ACTIVE_STATES = frozenset(
    {
        "PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "REQUEUED",
        "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "SPECIAL_EXIT",
        "RESV_DEL_HOLD", "STOPPED",
    }
)  # fmt: skip
"""Slurm job states in which the job has not ended (it may still run, or run again)."""


@dataclass(frozen=True)
class JobInfo:
    """A Slurm job as ``scontrol``, ``sacct`` or the jobcomp file tells it."""

    state: str
    """Slurm's word for it; ``UNKNOWN`` when the answer was blank, odd or ambiguous."""
    fields: dict[str, str]
    source: str

    @property
    def known(self) -> bool:
        """Whether the answer names a state (``UNKNOWN``: Slurm's answer cannot tell)."""
        return self.state != "UNKNOWN"

    @property
    def ended(self) -> bool:
        # Preempted or its node failed, with --requeue: Slurm queues it again (it will run).
        if self.state in {"PREEMPTED", "NODE_FAIL"} and self.fields.get("Requeue") == "1":
            return False
        return self.state not in ACTIVE_STATES


_FIELD = re.compile(r"\b(\w++)=(\S*+)")
# From a word's start, possessive: linear in the line (a search from every letter of a long
# word without = was quadratic: 20,000 letters, 1.7 s).

_STATE = re.compile(r"[A-Z][A-Z_]{0,31}")
"""A Slurm job state as the runner believes one: a word of capitals (sacct may add ``by
<uid>``, which is dropped); anything else is ``UNKNOWN``."""

_SLURMS_OWN = ("JobState", "Requeue")
"""The fields :meth:`Cluster.job` reads that Slurm prints after the job's name and before the
free text of its owner (comment, command, work folder, output files)."""


def parse_fields(text: str) -> dict[str, str]:
    """``Key=Value`` pairs of a one-line ``scontrol -o`` or jobcomp record; the first of a key
    wins. Slurm prints its own fields (``JobState``, ``Requeue``) before the free text a job's
    owner writes (``--comment``, the command, the work folder), which may hold ``JobState=``
    too; only the job's name comes earlier (see :func:`_forged`)."""
    fields: dict[str, str] = {}
    for key, value in _FIELD.findall(text):
        fields.setdefault(key, value)
    return fields


def _forged(text: str) -> bool:
    """Whether a record holds one of :data:`_SLURMS_OWN` more than once: the job's name
    (``JobName``, ``Name``), printed before them, holds ``Key=`` text, so the first
    occurrence is not Slurm's either."""
    seen: set[str] = set()
    for key, _ in _FIELD.findall(text):
        if key in _SLURMS_OWN:
            if key in seen:
                return True
            seen.add(key)
    return False


def _state(text: str) -> str:
    """A state word Slurm printed, or ``UNKNOWN`` (blank, or not a state word)."""
    words = text.split(maxsplit=1)
    return words[0] if words and _STATE.fullmatch(words[0]) else "UNKNOWN"


class Cluster:
    """The Slurm commands, each with a timeout; a failure is an infrastructure error that
    names the command and what it said."""

    def __init__(self, timeout: float = COMMAND_TIMEOUT_SECONDS) -> None:
        self.timeout = timeout
        self._config: dict[str, str] | None = None

    def run(self, *argv: str, check: bool = True) -> str:
        """The command's stdout; with ``check``, a failure if it exits non-zero."""
        done = self._exec(list(argv))
        if check and done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[-400:]
            raise InfrastructureError(f"{' '.join(argv[:2])} failed: {said}")
        return done.stdout

    def _exec(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """Run ``argv``; never more than :data:`MAX_OUTPUT_BYTES` of its output or error is
        read (more is a failure: what a Slurm command prints is not trusted to be small)."""
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except FileNotFoundError:
            raise InfrastructureError(
                f"{argv[0]} is not installed on this host",
                hint="submit from a Slurm login node (slurm-client installed)",
            ) from None
        try:
            out, err = _read_capped(proc, self.timeout, MAX_OUTPUT_BYTES)
        except subprocess.TimeoutExpired:
            raise InfrastructureError(
                f"{' '.join(argv[:2])} did not answer within {self.timeout:g} s",
                hint="is slurmctld running? (`scontrol ping`)",
            ) from None
        except OverflowError:
            raise InfrastructureError(
                f"{' '.join(argv[:2])} printed more than {MAX_OUTPUT_BYTES:,} bytes"
            ) from None
        text = (out.decode(errors="replace"), err.decode(errors="replace"))
        return subprocess.CompletedProcess(argv, proc.returncode, *text)

    def config(self) -> dict[str, str]:
        if self._config is None:
            out = self.run("scontrol", "show", "config")
            self._config = {
                k.strip(): v.strip()
                for k, sep, v in (line.partition("=") for line in out.splitlines())
                if sep
            }
        return self._config

    def kill_wait(self) -> int:
        value = self.config().get("KillWait", "30 sec").split()[0]
        return int(value) if value.isascii() and value.isdigit() else 30

    def _where(self, partition: str | None) -> list[str]:
        """``sinfo``'s partition option: the one given, else the cluster's default (the one
        sbatch puts a job in when it names none); none when the cluster marks no default."""
        if partition is None:
            marked = [p for p in self.run("sinfo", "-h", "-o", "%P").split() if p.endswith("*")]
            partition = marked[0].rstrip("*") if marked else None
        return [f"--partition={partition}"] if partition else []

    def partition_nodes(self, partition: str | None) -> int:
        """How many nodes the job may land on: the partition's (the default one's when it
        names none), not the cluster's."""
        args = ["sinfo", "-h", "-N", "-o", "%N", *self._where(partition)]
        return len(set(self.run(*args).split()))

    def gpu_types(self, partition: str | None) -> list[str]:
        args = ["sinfo", "-h", "-o", "%G", *self._where(partition)]
        return offered_gpu_types(self.run(*args))

    def sbatch(self, args: list[str], script: Path, *, test_only: bool = False) -> str:
        """Submit (or with ``test_only``, ask whether Slurm would accept) one job; its id."""
        argv = ["sbatch", *(["--test-only"] if test_only else []), *args, str(script)]
        done = self._exec(argv)
        said = (done.stderr or done.stdout).strip()[-400:]
        if done.returncode != 0:
            raise PolicyViolation(
                f"Slurm refuses the job: {said}",
                hint="check --partition, --account and --time against `sinfo`, and the "
                "contract's caps against the partition's nodes",
            )
        if test_only:
            return ""
        job = done.stdout.strip().split(";")[0]
        if not (job.isascii() and job.isdigit()):
            raise InfrastructureError(f"sbatch answered no job id: {said}")
        return job

    def cancel(self, slurm_job: str) -> None:
        self.run("scancel", slurm_job)

    def active(self, slurm_jobs: list[str]) -> dict[str, str] | None:
        """Those of ``slurm_jobs`` Slurm still queues or runs, with their states, from one
        ``squeue`` for all (a waiter polling each job's ``scontrol`` would load slurmctld and
        the CPUs the jobs run on); None when squeue fails (it does when the only job asked
        for is unknown): then ask :meth:`job` for each."""
        if not slurm_jobs:
            return {}
        done = self._exec(["squeue", "-h", "-o", "%i|%T", "-j", ",".join(slurm_jobs)])
        if done.returncode != 0:
            return None
        found = {}
        for line in done.stdout.splitlines():
            job, _, state = line.strip().partition("|")
            if state in ACTIVE_STATES:
                found[job] = state
        return found

    def job(self, slurm_job: str) -> JobInfo | None:
        """The job's state: ``scontrol`` while slurmctld remembers it (MinJobAge), else
        ``sacct`` where accounting runs, else the jobcomp file; None when none knows it."""
        out = self.run("scontrol", "-o", "show", "job", slurm_job, check=False)
        fields = parse_fields(out)
        if fields.get("JobId") == slurm_job and "JobState" in fields:
            if _forged(out):  # the job's name says JobState=: squeue prints the state alone
                # Requeue is not known then: taken as set, so that a preempted job counts as
                # one Slurm may run again (the fence cancels it rather than trust its end).
                fields = {"JobId": slurm_job, "Requeue": "1"}
                return JobInfo(self._queued_state(slurm_job), fields, "squeue")
            return JobInfo(_state(fields["JobState"]), fields, "scontrol")
        acct = self.run(
            "sacct", "-n", "-X", "-P", "-o", "JobID,State,ExitCode", "-j", slurm_job, check=False
        )
        for line in acct.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[0] == slurm_job:
                return JobInfo(_state(parts[1]), {"ExitCode": parts[2]}, "sacct")
        return self._jobcomp(slurm_job)

    def _queued_state(self, slurm_job: str) -> str:
        """The job's state from ``squeue`` (every state slurmctld remembers), one word alone
        on its line; ``UNKNOWN`` when it says anything else."""
        out = self.run("squeue", "-h", "-t", "all", "-o", "%T", "-j", slurm_job, check=False)
        words = out.split()
        return _state(words[0]) if len(words) == 1 else "UNKNOWN"

    def _jobcomp(self, slurm_job: str) -> JobInfo | None:
        config = self.config()
        if config.get("JobCompType") != "jobcomp/filetxt":
            return None
        path = Path(config.get("JobCompLoc", ""))
        if not path.is_file():
            return None
        found = None
        with path.open(errors="replace") as f:
            for line in f:
                if line.startswith(f"JobId={slurm_job} "):
                    found = line
        if found is None:
            return None
        fields = parse_fields(found)
        if _forged(found):  # the job's name says JobState=: no other record to ask
            return JobInfo("UNKNOWN", {"JobId": slurm_job}, "jobcomp")
        return JobInfo(_state(fields.get("JobState", "")), fields, "jobcomp")


MAX_OUTPUT_BYTES = 4 * 1024 * 1024
"""The most of a Slurm command's output (and, apart, of its error) read."""


def _read_capped(proc: subprocess.Popen[bytes], timeout: float, cap: int) -> tuple[bytes, bytes]:
    """``proc``'s output and error once it exits; the process killed and TimeoutExpired
    after ``timeout`` seconds, OverflowError past ``cap`` bytes of either."""
    if proc.stdout is None or proc.stderr is None:
        raise ValueError("_read_capped wants a process with its output and error piped")
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    deadline = time.monotonic() + timeout
    try:
        with selectors.DefaultSelector() as sel:
            for fd in bufs:
                sel.register(fd, selectors.EVENT_READ)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(proc.args, timeout)
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fd)
                    elif len(buf := bufs[key.fd]) + len(chunk) > cap:
                        raise OverflowError(cap)
                    else:
                        buf += chunk
        proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        proc.stdout.close()
        proc.stderr.close()
    return bytes(bufs[out_fd]), bytes(bufs[err_fd])


@dataclass(frozen=True)
class Ended:
    """A submitted job that has its end: its envelope (as JSON data) when `runner run` wrote
    one, and the Slurm job's state and log file either way."""

    job_id: str
    slurm_job: str
    slurm_state: str
    envelope: dict[str, Any] | None
    log: Path
    slurm_active: bool = False
    """The ledger says finished while the Slurm job has not ended yet (its runner exiting)."""


def check_end(
    state: Path, job_id: str, cluster: Cluster, queued: dict[str, str] | None = None
) -> Ended | None:
    """The job's end, or None while it may still run: the ledger's ``job.finished`` (with the
    job's result.json), else the Slurm job's end with the envelope its batch wrote (None when
    the runner wrote none), unless a runner still holds the job's lock (a served runner whose
    batch step was ended from outside: the job runs on, and its end is the ledger's).
    ``queued`` (:meth:`Cluster.active`, asked once for many jobs) spares the questions to
    Slurm about a job that still runs and has no result yet."""
    from runner.state.jobdir import StateDir
    from runner.state.ledger import read_state

    sub = submission_of(state, job_id)
    slurm_job = str(sub["slurmJobId"])
    folder = record_dir(state, job_id)
    log = folder / f"slurm-{slurm_job}.out"
    job = StateDir(state).job(job_id)
    if queued is not None and slurm_job in queued and not job.envelope.is_file():
        return None  # queued or running, and no result yet: nothing to ask Slurm
    finished = job.ledger.is_file() and read_state(job.ledger).finished is not None
    info = cluster.job(slurm_job)
    if finished and job.envelope.is_file():
        data = _json(job.envelope)
        if data is not None:
            state_now, active = (info.state, not info.ended) if info else ("UNKNOWN", False)
            return Ended(job_id, slurm_job, state_now, data, log, active)
    if info is None:
        raise InfrastructureError(
            f"job {job_id}: Slurm knows no job {slurm_job} (not scontrol, sacct nor the jobcomp "
            "file)",
            hint=f"its log is {log}",
        )
    if not info.known:  # a blank or odd state: Slurm's answer cannot tell (asked again)
        raise InfrastructureError(
            f"job {job_id}: Slurm's answer for job {slurm_job} ({info.source}) names no state "
            "the runner knows",
            hint=f"`scontrol show job {slurm_job}` and `sacct -j {slurm_job}` say what Slurm has",
        )
    if not info.ended:
        return None
    if not finished and locks.is_held(job.lock):
        return None  # Slurm's job has ended, but a runner (a served one) still runs the job
    return Ended(job_id, slurm_job, info.state, _json(folder / f"envelope-{slurm_job}.json"), log)


MAX_ENVELOPE_BYTES = 64 * 1024 * 1024
"""The most of an envelope read back from the state folder (the export's cap too)."""


def _json(path: Path) -> dict[str, Any] | None:
    """A file's JSON object, or None when it is missing, empty, not one, not a regular file
    (a link, a FIFO) or larger than :data:`MAX_ENVELOPE_BYTES`."""
    try:
        with open_regular(path) as f:
            raw = f.read(MAX_ENVELOPE_BYTES + 1)
        if len(raw) > MAX_ENVELOPE_BYTES:
            return None
        data = json.loads(raw)
    except (OSError, ValueError, UnsafePath):
        return None
    return data if isinstance(data, dict) and "status" in data else None


def describe(state: Path, job_id: str, cluster: Cluster | None = None) -> dict[str, Any] | None:
    """The Slurm side of a job for `runner status`: its latest submission and the Slurm
    job's state now; None when the job was never submitted."""
    sub = last_submission(state, job_id)
    if sub is None:
        return None
    slurm_job = str(sub["slurmJobId"])
    try:
        info = (cluster or Cluster()).job(slurm_job)
        now = info.state if info else "UNKNOWN (Slurm no longer knows it)"
    except InfrastructureError as exc:
        now = f"unknown ({exc.message})"
    return {
        "slurmJobId": slurm_job,
        "state": now,
        "partition": sub.get("partition"),
        "timeMinutes": sub.get("timeMinutes"),
        "submittedAt": sub.get("submittedAt"),
        "log": str(record_dir(state, job_id) / f"slurm-{slurm_job}.out"),
    }
