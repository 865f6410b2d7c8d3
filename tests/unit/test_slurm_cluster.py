"""What `runner cluster submit` asks Slurm about where a job can land (pure logic: `sinfo`'s
answers given by a stand-in for the one method that runs commands)."""

from __future__ import annotations

import subprocess

import pytest

from runner.scheduling.slurm.cluster import Cluster

SINFO = {
    ("sinfo", "-h", "-o", "%P"): "debug*\ntwo\n",
    ("sinfo", "-h", "-N", "-o", "%N"): "localhost\nrnode1\nrnode2\n",
    ("sinfo", "-h", "-N", "-o", "%N", "--partition=debug"): "localhost\n",
    ("sinfo", "-h", "-N", "-o", "%N", "--partition=two"): "rnode1\nrnode2\nrnode1\n",
    ("sinfo", "-h", "-o", "%G"): "gpu:h100:4\n(null)\n",
    ("sinfo", "-h", "-o", "%G", "--partition=debug"): "(null)\n",
    ("sinfo", "-h", "-o", "%G", "--partition=two"): "gpu:h100:4\n",
}


class _Said(Cluster):
    def __init__(self, answers: dict[tuple[str, ...], str]) -> None:
        super().__init__()
        self.answers = answers

    def _exec(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, self.answers[tuple(argv)], "")


def test_no_partition_named_means_the_default_one_not_the_whole_cluster() -> None:
    """A job that names no partition lands in the default one: its one node decides whether a
    local state folder will do, not the three nodes of the cluster (a second partition made a
    single-node default refuse every local --state-dir)."""
    cluster = _Said(SINFO)
    assert cluster.partition_nodes(None) == 1
    assert cluster.partition_nodes("two") == 2
    assert cluster.gpu_types(None) == []
    assert cluster.gpu_types("two") == ["h100"]


@pytest.mark.parametrize("listing", ["debug\ntwo\n", ""])
def test_a_cluster_with_no_default_partition_counts_every_node(listing: str) -> None:
    """No partition marked default (or none listed): sbatch would refuse a job naming none, and
    counting every node is the careful answer for the state-folder check."""
    cluster = _Said({**SINFO, ("sinfo", "-h", "-o", "%P"): listing})
    assert cluster.partition_nodes(None) == 3
