"""The benchmark's CPU split (benchmarks/cpu.py): who spent a measured window's CPU seconds."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from benchmarks.cpu import CpuMeter, CpuUse, note, per_job

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}:\n    pass\n"


def test_a_reaped_child_counts_as_the_runs_own() -> None:
    """A child that burns 0.3 s of CPU inside the window is at least 0.3 s of ``own``, and
    the machine's busy time holds it too."""
    uses: list[CpuUse] = []
    with CpuMeter().window(uses):
        subprocess.run([sys.executable, "-c", BURN.format(s=0.3)], check=True)
    (use,) = uses
    assert use.own >= 0.3
    assert use.machine >= 0.25  # whole clock ticks: the kernel counts them 10 ms at a time
    assert use.rest >= 0.0


def test_a_servers_reaped_forks_count_as_the_runs_own() -> None:
    """For a served run, the CPU of a server's fork counts once the server has reaped it;
    the window waits (bounded) for that reap, as `runner serve` reaps once a second."""
    server = subprocess.Popen(
        [sys.executable, "-c",
         "import os, time\n"
         "pid = os.fork()\n"
         "if pid == 0:\n"
         f"    exec({BURN.format(s=0.3)!r})\n"
         "    os._exit(0)\n"
         "time.sleep(0.8)\n"  # reaped late, after the fork has ended
         "os.waitpid(pid, 0)\n"
         "time.sleep(30)\n"],
    )  # fmt: skip
    try:
        time.sleep(0.2)  # the fork exists
        uses: list[CpuUse] = []
        with CpuMeter(server.pid).window(uses):
            time.sleep(0.5)  # the fork burns; it is reaped after the block
        assert uses[0].own >= 0.25, uses
    finally:
        server.kill()
        server.wait()


def test_per_job_divides_the_medians() -> None:
    uses = [CpuUse(2.0, 1.0, 5.0), CpuUse(4.0, 1.0, 7.0), CpuUse(3.0, 3.0, 6.0)]
    assert per_job(uses, 2) == {"own": 1.5, "engine": 0.5, "rest": 1.0, "machine": 3.0}
    assert per_job([], 2) == {}


def test_rest_is_never_negative() -> None:
    """Clock ticks can make the machine's count fall short of the parts."""
    assert CpuUse(0.31, 0.1, 0.4).rest == 0.0


@pytest.mark.parametrize(("runner", "baseline"), [({}, {"own": 1.0}), ({"own": 1.0}, {})])
def test_the_note_says_when_nothing_was_measured(
    runner: dict[str, float], baseline: dict[str, float]
) -> None:
    assert note(runner, baseline, "x") == "CPU a job: not measured"


def test_the_note_names_each_share() -> None:
    shares = {"own": 0.07, "engine": 0.05, "rest": 0.2, "machine": 0.32}
    text = note(shares, {**shares, "own": 0.02}, "the batch and its forks")
    assert "the batch and its forks 0.070 s against the `docker` CLI's 0.020 s" in text
    assert "the engine (dockerd, containerd) 0.050 s" in text
