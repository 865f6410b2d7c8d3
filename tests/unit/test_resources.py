"""Resource accounting without an engine: the engine's stats answers turned into figures
(hostile answers among them), the bounded series and its downsampling, the sampler's figures
and totals, and a run through the orchestrator with the fake backend (sampling on and off).
The real engine's figures are checked against its cgroup files in
tests/integration/test_resources_engine.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from runner.backends.fake import FakeBackend, FakeJob
from runner.backends.stats import STATS_LINE_MAX, StatsSample, parse_libpod_stats, parse_stats
from runner.backends.types import ENGINE_COUNT_MAX, engine_count
from runner.execution.resources import Point, Sampler, Sampling, Series, totals
from runner.gpu.usage import GpuReading, GpuUsage
from runner.models.envelope import AttemptRecord
from runner.models.resources import AttemptResources, ResourceRecord
from tests.support.clock import VirtualClock
from tests.unit.test_orchestrator_fake import _contract, _options, _run


def answer(**over: Any) -> dict[str, Any]:
    """A Docker stats answer under cgroup v1, as this host's engine gives one."""
    a: dict[str, Any] = {
        "read": "2026-12-02T17:30:12.328523166Z",
        "pids_stats": {"current": 3, "limit": 256},
        "blkio_stats": {
            "io_service_bytes_recursive": [
                {"major": 8, "minor": 0, "op": "Read", "value": 4096},
                {"major": 8, "minor": 0, "op": "Write", "value": 1 << 20},
                {"major": 8, "minor": 16, "op": "Write", "value": 1 << 20},
                {"major": 8, "minor": 0, "op": "Total", "value": 999},
            ]
        },
        "cpu_stats": {
            "cpu_usage": {
                "total_usage": 1_500_000_000,
                "usage_in_kernelmode": 500_000_000,
                "usage_in_usermode": 1_000_000_000,
            }
        },
        "memory_stats": {"usage": 50 << 20, "max_usage": 120 << 20, "limit": 1 << 30},
    }
    a.update(over)
    return a


def test_a_v1_answer_gives_every_figure() -> None:
    s = parse_stats(json.dumps(answer()).encode())
    assert s == StatsSample(
        cpu_ns=1_500_000_000,
        cpu_user_ns=1_000_000_000,
        cpu_system_ns=500_000_000,
        memory_bytes=50 << 20,
        memory_peak_bytes=120 << 20,
        memory_limit_bytes=1 << 30,
        io_read_bytes=4096,
        io_write_bytes=2 << 20,
        pids=3,
        pids_limit=256,
    )


def test_a_v2_answer_has_no_engine_peak_and_lower_case_ops() -> None:
    a = answer(memory_stats={"usage": 7, "limit": 100})
    a["blkio_stats"] = {"io_service_bytes_recursive": [{"op": "read", "value": 5}]}
    s = parse_stats(a)
    assert s is not None
    assert (s.memory_peak_bytes, s.memory_bytes, s.io_read_bytes, s.io_write_bytes) == (
        None, 7, 5, None,
    )  # fmt: skip


def test_the_zero_answer_of_a_stopped_container_is_no_sample() -> None:
    assert parse_stats(answer(read="0001-01-01T00:00:00Z")) is None
    assert parse_stats({"memory_stats": {}}) is None  # no read time at all


@pytest.mark.hostile
@pytest.mark.parametrize(
    "value",
    [True, -1, 1.5, "12", None, [1], {"a": 1}, ENGINE_COUNT_MAX + 1, 10**400],
)
def test_an_engine_figure_that_is_not_a_counter_is_absent_not_zero(value: object) -> None:
    assert engine_count(value) is None
    a = answer(memory_stats={"usage": value, "max_usage": value, "limit": value})
    a["cpu_stats"] = {"cpu_usage": {"total_usage": value}}
    a["pids_stats"] = {"current": value}
    a["blkio_stats"] = {"io_service_bytes_recursive": [{"op": "Write", "value": value}]}
    s = parse_stats(a)
    assert s is not None
    assert s == StatsSample()  # every figure absent


@pytest.mark.hostile
@pytest.mark.parametrize(
    "text",
    [
        b"not json",
        b"[1, 2]",
        b'"read"',
        b"[" * 100_000 + b"]" * 100_000,  # nesting past the recursion limit
        b" " * (STATS_LINE_MAX + 1),
        json.dumps({"read": 17}).encode(),
        json.dumps({"read": "2026", "cpu_stats": [], "memory_stats": "x"}).encode(),
    ],
)
def test_a_hostile_answer_never_crashes_and_gives_nothing_it_did_not_say(text: bytes) -> None:
    s = parse_stats(text)
    assert s is None or s == StatsSample()


@pytest.mark.hostile
def test_io_sums_are_capped_and_bad_entries_skipped() -> None:
    entries: list[object] = [{"op": "Write", "value": ENGINE_COUNT_MAX}] * 3
    entries += ["x", {"op": 5, "value": 1}, {"op": "Read"}, {"op": "Read", "value": -5}]
    s = parse_stats(answer(blkio_stats={"io_service_bytes_recursive": entries}))
    assert s is not None
    assert s.io_write_bytes == ENGINE_COUNT_MAX
    assert s.io_read_bytes is None


def test_a_series_keeps_at_most_its_points_and_its_whole_span() -> None:
    series = Series(max_points=16)
    for i in range(10_000):  # a 10,000 s run at one sample a second
        series.add(Point(float(i), cpu_ns=i * 10**9, memory_bytes=i % 97, pids=1))
    points = series.finish()
    assert 8 <= len(points) <= 16
    assert series.interval >= 10_000 / 16
    assert points[-1].t == 9999.0 and points[-1].cpu_ns == 9999 * 10**9  # the last counter
    assert points[0].t < series.interval  # the start is still there
    ts = [p.t for p in points]
    assert ts == sorted(ts)


def test_merging_keeps_peaks_and_the_last_counters() -> None:
    series = Series(max_points=4)
    memory = [10, 500, 20, 30, 40, 700, 1, 2, 3]
    for i, m in enumerate(memory):
        series.add(Point(float(i), cpu_ns=i, memory_bytes=m, io_write_bytes=i * 2))
    points = series.finish()
    assert len(points) <= 4
    assert max(p.memory_bytes or 0 for p in points) == 700
    assert 500 in [p.memory_bytes for p in points]  # both peaks survive the merges
    assert points[-1].cpu_ns == 8 and points[-1].io_write_bytes == 16


def test_samples_within_an_interval_join_one_point() -> None:
    series = Series(max_points=8)
    for t, m in [(0.0, 1), (0.3, 9), (0.6, 2), (1.2, 3)]:
        series.add(Point(t, memory_bytes=m))
    assert [(p.t, p.memory_bytes) for p in series.finish()] == [(0.6, 9), (1.2, 3)]


def test_a_series_of_an_odd_size_is_refused() -> None:
    with pytest.raises(ValueError, match="max_points"):
        Series(max_points=5)


def test_the_sampler_figures_are_the_last_counters_and_the_peaks(
    virtual_clock: VirtualClock,
) -> None:
    origin = virtual_clock.monotonic()
    sampler = Sampler(FakeBackend(), "c", Sampling("docker", "runc", 256), origin)
    for i, (mem, peak) in enumerate([(10, 100), (300, 400), (20, 400)]):
        virtual_clock.advance(1.0)
        sampler.take(
            StatsSample(cpu_ns=(i + 1) * 10**9, memory_bytes=mem, memory_peak_bytes=peak,
                        memory_limit_bytes=1000, pids=5 - i, io_write_bytes=None)
        )  # fmt: skip
    f = sampler.figures()
    assert (f.samples, f.lastSampleSeconds, f.cpuSeconds) == (3, 3.0, 3.0)
    assert (f.memoryPeakBytes, f.memoryPeakSource, f.memoryPeakFraction) == (400, "engine", 0.4)
    assert (f.pidsPeak, f.pidsLimit, f.ioWriteBytes) == (5, 256, None)


def test_without_an_engine_peak_the_peak_is_sampled_and_gvisor_has_no_pids(
    virtual_clock: VirtualClock,
) -> None:
    sampler = Sampler(FakeBackend(), "c", Sampling("docker", "runsc", None), 0.0)
    for mem in (5, 50, 7):
        sampler.take(StatsSample(memory_bytes=mem, pids=40))
    f = sampler.figures()
    assert (f.memoryPeakBytes, f.memoryPeakSource, f.memoryLimitBytes) == (50, "sampled", None)
    assert f.memoryPeakFraction is None and f.pidsPeak is None


def test_no_sample_leaves_every_figure_absent() -> None:
    f = Sampler(FakeBackend(), "c", Sampling("docker", "runc", 1), 0.0).figures()
    assert f.samples == 0 and f.cpuSeconds is None and f.memoryPeakBytes is None
    assert f.memoryPeakSource is None and f.lastSampleSeconds is None


def _figures(**kw: Any) -> AttemptResources:
    base: dict[str, Any] = dict.fromkeys(AttemptResources.model_fields, None)
    base.update(engine="docker", runtime="runc", samples=1, gpus=[])
    base.update(kw)
    return AttemptResources(**base)


def test_totals_sum_counters_and_take_the_most_of_peaks() -> None:
    a = [
        AttemptRecord(attempt=1, classification="x", seconds=1, how=None, files=[],
                      resources=_figures(cpuSeconds=1.25, memoryPeakBytes=10, ioWriteBytes=5)),
        AttemptRecord(attempt=2, classification="x", seconds=1, how=None, files=[]),
        AttemptRecord(attempt=3, classification="x", seconds=1, how=None, files=[],
                      resources=_figures(cpuSeconds=2.0, memoryPeakBytes=30, pidsPeak=4)),
    ]  # fmt: skip
    t = totals(a)
    assert t is not None
    assert (t.attempts, t.cpuSeconds, t.memoryPeakBytes, t.ioWriteBytes, t.pidsPeak) == (
        2, 3.25, 30, 5, 4,
    )  # fmt: skip
    assert t.ioReadBytes is None
    assert totals(a[1:2]) is None


def test_a_run_records_figures_series_and_totals(tmp_path: Path) -> None:
    fake = FakeBackend()
    info = fake.add_image()
    stats = tuple(answer(cpu_stats={"cpu_usage": {"total_usage": i * 10**9}}) for i in (1, 2))
    fake.jobs = FakeJob(seconds=1.0, stats=(*stats, answer(read="0001-01-01T00:00:00Z")))
    env = _run(_contract(tmp_path, info), _options(tmp_path), fake)
    figures = env["attempts"][0]["resources"]
    assert figures["samples"] == 2 and figures["cpuSeconds"] == 2.0
    assert figures["memoryPeakBytes"] == 120 << 20 and figures["ioWriteBytes"] == 2 << 20
    assert figures["series"] == "record/attempts/1/resources.json"
    assert env["resources"]["cpuSeconds"] == 2.0 and env["resources"]["attempts"] == 1
    job = Path(env["jobDir"])
    record = ResourceRecord.model_validate_json((job / figures["series"]).read_bytes())
    assert len(record.series.t) == len(record.series.cpuSeconds) >= 1
    kept = [f["path"] for f in env["attempts"][0]["files"]]
    assert figures["series"] in kept  # hashed with the attempt's record, so the bundle has it


def test_sampling_off_opens_no_stats_stream(tmp_path: Path) -> None:
    fake = FakeBackend()
    info = fake.add_image()
    fake.jobs = FakeJob(stats=(answer(),))
    env = _run(_contract(tmp_path, info), _options(tmp_path, resource_sampling=False), fake)
    assert not [c for c in fake.calls if c[0] == "follow_stats"]
    assert env["attempts"][0]["resources"] is None and env["resources"] is None


@pytest.mark.hostile
def test_a_resources_file_that_is_a_link_or_garbage_is_not_read(tmp_path: Path) -> None:
    fake = FakeBackend()
    info = fake.add_image()
    fake.jobs = FakeJob(seconds=1.0, stats=(answer(),))
    env = _run(_contract(tmp_path, info), _options(tmp_path), fake)
    from runner.execution.resources import read_figures
    from runner.state.jobdir import JobDir

    job = JobDir(Path(env["jobDir"]))
    assert read_figures(job, 1) is not None
    path = job.attempt_record(1) / "resources.json"
    target = tmp_path / "elsewhere.json"
    target.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(target)
    assert read_figures(job, 1) is None
    path.unlink()
    path.write_text('{"attempt": 1, "figures": {"samples": -1}}')
    assert read_figures(job, 1) is None


def libpod(**over: Any) -> dict[str, Any]:
    """An answer of Podman's own stats stream (4.3), as this host's Podman gives one."""
    entry: dict[str, Any] = {
        "ContainerID": "c", "CPUNano": 32_506_434, "CPUSystemNano": 4_000_000,
        "MemUsage": 393_216, "MemLimit": 1 << 30, "BlockInput": 0, "BlockOutput": 8192,
        "PIDs": 2, "UpTime": 1_000_000_000,
    }  # fmt: skip
    entry.update(over)
    return {"Error": None, "Stats": [entry]}


def test_a_libpod_answer_gives_its_figures_and_no_peak() -> None:
    s = parse_libpod_stats(json.dumps(libpod()))
    assert s == StatsSample(
        cpu_ns=32_506_434, cpu_system_ns=4_000_000, memory_bytes=393_216,
        memory_limit_bytes=1 << 30, io_read_bytes=0, io_write_bytes=8192, pids=2,
    )  # fmt: skip


@pytest.mark.hostile
@pytest.mark.parametrize(
    "raw",
    [
        libpod(UpTime=0, CPUNano=0, MemUsage=0),  # the zero entry of an ended container
        {"Error": "no such container", "Stats": [libpod()["Stats"][0]]},
        {"Error": None, "Stats": []},
        {"Error": None, "Stats": ["x"]},
        {"Error": None, "Stats": "x"},
        [1],
        b"{",
    ],
)
def test_a_libpod_answer_that_is_no_sample(raw: object) -> None:
    assert parse_libpod_stats(raw) is None


@pytest.mark.hostile
def test_a_libpod_figure_that_is_not_a_counter_is_absent() -> None:
    s = parse_libpod_stats(libpod(CPUNano=-3, MemUsage=True, MemLimit=0, PIDs="2", BlockOutput=1.5))
    assert s is not None
    assert (s.cpu_ns, s.memory_bytes, s.memory_limit_bytes, s.pids, s.io_write_bytes) == (
        None, None, None, None, None,
    )  # fmt: skip


class FakeGpuReader:
    """NVML's place in tests: each read gives the next of ``readings`` (then the last again)."""

    def __init__(self, readings: list[list[GpuReading]]) -> None:
        self.readings, self.reads, self.closed = readings, 0, False

    def read(self, uuids: Sequence[str]) -> list[GpuReading]:
        got = self.readings[min(self.reads, len(self.readings) - 1)]
        self.reads += 1
        return got

    def close(self) -> None:
        self.closed = True


def test_gpu_figures_integrate_utilisation_and_keep_the_memory_peak(
    virtual_clock: VirtualClock,
) -> None:
    reader = FakeGpuReader(
        [
            [GpuReading("GPU-a", 1.0, 10 << 30), GpuReading("GPU-b", None, None)],
            [GpuReading("GPU-a", 0.5, 40 << 30), GpuReading("GPU-b", None, None)],
            [GpuReading("GPU-a", 0.0, 20 << 30), GpuReading("GPU-b", None, None)],
        ]
    )
    how = Sampling("docker", "runc", 1, gpus=("GPU-a", "GPU-b"), gpu_reader=reader)
    sampler = Sampler(FakeBackend(), "c", how, virtual_clock.monotonic())
    for _ in range(3):
        virtual_clock.advance(2.0)
        sampler.take(StatsSample(cpu_ns=1))
    sampler.stop()
    a, b = sampler.figures().gpus
    # trapezoids: 2 s at (1.0 + 0.5) / 2, then 2 s at (0.5 + 0.0) / 2
    assert (a.uuid, a.gpuSeconds, a.utilisationMean, a.memoryPeakBytes) == (
        "GPU-a", 2.0, 0.5, 40 << 30,
    )  # fmt: skip
    assert (b.gpuSeconds, b.utilisationMean, b.memoryPeakBytes) == (None, None, None)
    assert reader.closed


@pytest.mark.hostile
def test_a_reading_of_a_device_the_job_was_not_given_is_ignored() -> None:
    usage = GpuUsage(("GPU-a",))
    usage.add(0.0, [GpuReading("GPU-other", 1.0, 1 << 40)])
    (a,) = usage.figures()
    assert (a.gpuSeconds, a.memoryPeakBytes) == (None, None)


@pytest.mark.hostile
@pytest.mark.parametrize("percent", [101, -1, float("nan"), float("inf"), True, "50", None])
def test_nvml_utilisation_out_of_range_is_absent(percent: object) -> None:
    from runner.gpu.usage import _fraction

    assert _fraction(percent) is None
    assert _fraction(50) == 0.5


def test_without_gpus_no_reader_is_made_and_the_list_is_empty() -> None:
    sampler = Sampler(FakeBackend(), "c", Sampling("docker", "runc", 1), 0.0)
    sampler.take(StatsSample(cpu_ns=1))
    assert sampler.figures().gpus == []


def test_nvml_without_a_driver_reads_nothing() -> None:
    from runner.gpu.usage import NvmlReader

    r = NvmlReader()
    assert r.read(["GPU-x"]) == [GpuReading("GPU-x", None, None)]  # no GPU on this host
    r.close()
