"""The one store of cluster submissions (runner/scheduling/submissions.py): records written
before it (Slurm's sorted lines, Kubernetes' compact ones) are read as they are, the last line
is the latest, a damaged last line is an error naming the file, and a job id that is a path
is no submission. Real files under tmp_path; no cluster."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runner.core.errors import InfrastructureError, JobNotFound
from runner.scheduling import submissions
from runner.scheduling.kubernetes import plan
from runner.scheduling.slurm import batch


def test_records_written_before_the_store_are_read(tmp_path: Path) -> None:
    slurm = tmp_path / "slurm" / "job-1" / "submissions.jsonl"
    slurm.parent.mkdir(parents=True)
    slurm.write_text(
        '{"jobId": "job-1", "slurmJobId": "7", "submittedAt": "2026-01-01T00:00:00+00:00"}\n'
        '{"jobId": "job-1", "slurmJobId": "8", "submittedAt": "2026-01-02T00:00:00+00:00"}\n'
    )
    kube = tmp_path / "kubernetes" / "job-1" / "submissions.jsonl"
    kube.parent.mkdir(parents=True)
    kube.write_text(
        '{"to":"kubernetes","submittedAt":"2026-01-03T00:00:00+00:00","jobId":"job-1",'
        '"name":"runner-job-1-ab","namespace":"repro","context":null,"kubeconfig":null,'
        '"objects":[["NetworkPolicy","created"],["Job","created"]]}\n'
    )
    assert batch.last_submission(tmp_path, "job-1") == {
        "jobId": "job-1", "slurmJobId": "8", "submittedAt": "2026-01-02T00:00:00+00:00",
    }  # fmt: skip
    got = plan.last_submission(tmp_path, "job-1")
    assert got is not None and got["namespace"] == "repro"
    assert got["objects"] == [["NetworkPolicy", "created"], ["Job", "created"]]


def test_append_then_latest_for_each_cluster(tmp_path: Path) -> None:
    for n in (1, 2):
        submissions.append(tmp_path, "slurm", "job-2", {"slurmJobId": str(n), "jobId": "job-2"})
    assert (tmp_path / "slurm" / "job-2" / "submissions.jsonl").read_text().count("\n") == 2
    assert submissions.latest(tmp_path, "slurm", "job-2") == {"jobId": "job-2", "slurmJobId": "2"}
    assert submissions.latest(tmp_path, "kubernetes", "job-2") is None, "one folder a cluster"
    entry = plan.record_submission(
        tmp_path,
        {"jobId": "job-2", "contractDigest": "sha256:" + "0" * 64, "name": "n",
         "namespace": "ns", "context": None, "applied": [{"kind": "Job", "action": "created"}]},
    )  # fmt: skip
    assert plan.last_submission(tmp_path, "job-2") == {**entry, "objects": [["Job", "created"]]}


def test_damaged_or_foreign_last_lines_are_errors_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "slurm" / "job-3" / "submissions.jsonl"
    path.parent.mkdir(parents=True)
    for text, word in (
        ('{"slurmJobId": "1"}\n{"slurmJobId": ', "not JSON"),
        ("[1, 2]\n", "not a JSON object"),
        (b"\xff\xfe\n", "not JSON"),
        ("[" * 5000 + "]" * 5000 + "\n", "not JSON"),
        ('{"slurmJobId": "x; rm"}\n', "names no Slurm job id"),
        ('{"slurmJobId": "\u00b2\u0663"}\n', "names no Slurm job id"),  # digits, not ASCII
    ):
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(InfrastructureError, match=word) as caught:
            batch.last_submission(tmp_path, "job-3")
        assert str(path) in caught.value.message
    kube = tmp_path / "kubernetes" / "job-3" / "submissions.jsonl"
    kube.parent.mkdir(parents=True)
    kube.write_text('{"to": "slurm"}\n')
    with pytest.raises(InfrastructureError, match="not a Kubernetes submission"):
        plan.last_submission(tmp_path, "job-3")
    kube.write_text("\n\n")
    assert plan.last_submission(tmp_path, "job-3") is None, "no line: never submitted"


def test_a_job_id_that_is_a_path_is_no_submission(tmp_path: Path) -> None:
    (tmp_path / "slurm" / "x").mkdir(parents=True)
    (tmp_path / "slurm" / "x" / "submissions.jsonl").write_text('{"slurmJobId": "1"}\n')
    state = tmp_path / "state"
    for bad in ("../slurm/x", "..", "", "/etc"):
        assert submissions.latest(state, "slurm", bad) is None
        assert plan.last_submission(state, bad) is None
        with pytest.raises(JobNotFound, match="never submitted"):
            batch.submission_of(state, bad)


def test_an_envelope_read_back_is_a_capped_regular_file(tmp_path: Path) -> None:
    """The batch's envelope in the state folder is read only as a regular file (not through a
    link, never a FIFO, which would block) of at most the export's cap."""
    from runner.scheduling.slurm import cluster

    good = tmp_path / "envelope-1.json"
    good.write_text('{"status": "succeeded"}')
    assert cluster._json(good) == {"status": "succeeded"}
    link = tmp_path / "envelope-2.json"
    link.symlink_to(good)
    assert cluster._json(link) is None
    fifo = tmp_path / "envelope-3.json"
    os.mkfifo(fifo)
    assert cluster._json(fifo) is None
    big = tmp_path / "envelope-4.json"
    with big.open("wb") as f:
        f.write(b'{"status": "x", "pad": "')
        f.truncate(cluster.MAX_ENVELOPE_BYTES + 10)  # sparse: nothing written
    assert cluster._json(big) is None
