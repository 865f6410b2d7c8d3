"""The orchestrator's decisions, driven by the in-memory fake backend (no engine): every failure
category's classification, the resume table after a runner crash (the container vanished,
created, exited, still running) and the budget arithmetic across attempts. The same paths run
against the real engine in test_docker_jobs, test_restarts and the hostile suite; these add
fast coverage of the logic and replace none of them.
"""

from __future__ import annotations

import errno
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from runner.backends.base import ContainerState
from runner.backends.fake import FakeBackend, FakeJob
from runner.backends.types import ImageInfo
from runner.contract import Trust, with_digest
from runner.core import clock
from runner.core.errors import Category, EngineUnavailable, InfrastructureError
from runner.execution import orchestrator
from runner.execution.container import Outcome, Removal
from runner.execution.outcome import classify
from runner.gpu.gpus import Gpu
from runner.models.envelope import ResultEnvelope
from runner.planning import policy
from runner.state.ledger import parse_time, read_state
from tests.support import TOY
from tests.support.clock import VirtualClock

FIXTURES = Path(__file__).parents[1] / "fixtures" / "engine-states"
INF = float("inf")


class _Crash(BaseException):
    """The runner process dying (kill -9): nothing of it runs on, nothing is cleaned up."""


class _Progress:
    """Progress that can interrupt (Ctrl-C) or crash the runner at its first running tick."""

    def __init__(self, on_running: type[BaseException] | None = None) -> None:
        self.on_running = on_running
        self.stages: list[tuple[str, str]] = []

    def stage(self, name: str, detail: str) -> None:
        self.stages.append((name, detail))

    def running(self, elapsed: float, budget: float) -> None:
        if self.on_running is not None:
            raise self.on_running()

    def transfer(self, label: str, done: int, total: int) -> None:
        pass


class _NoGpus:
    def detect(self) -> list[Gpu]:
        return []


class _OneGpu:
    def detect(self) -> list[Gpu]:
        return [Gpu(0, "GPU-fake-0", "Fake H200", 141 * 1024**3, "580.0")]


def _writes(
    text: str = '{"accuracy": 0.819}\n', rel: str = "logs/evaluation.log"
) -> Callable[[dict[str, Path]], None]:
    def work(mounts: dict[str, Path]) -> None:
        target = mounts["/job/output"] / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    return work


Change = Callable[[dict[str, Any]], None]


def _contract(folder: Path, info: ImageInfo, change: Change | None = None, **env: Any) -> Path:
    data: dict[str, Any] = json.loads((TOY / "task.json").read_text())
    shutil.copytree(TOY / "repository", folder / "repository", dirs_exist_ok=True)
    shutil.copy(TOY / "paper.md", folder / "paper.md")
    data["environment"].update({"image": info.id, **env})
    if change is not None:
        change(data)
    path = folder / "task.json"
    path.write_text(json.dumps(with_digest(data)))
    return path


def _options(tmp_path: Path, **settings: Any) -> orchestrator.RunOptions:
    fields = {"acceptUnsigned": True, **settings.pop("policy", {})}
    loaded = policy.LoadedPolicy(policy.HostPolicy(**fields).resolved(), "test")
    return orchestrator.RunOptions(
        state_dir=tmp_path / "state",
        policy=loaded,
        trust=Trust(keys=[]),
        tick_seconds=0.01,
        heartbeat_seconds=settings.pop("heartbeat_seconds", 0.05),
        stop_grace_seconds=0.05,
        gpu_detector=settings.pop("gpu_detector", _NoGpus()),
        **settings,
    )


def _run(
    contract: Path,
    options: orchestrator.RunOptions,
    fake: FakeBackend,
    progress: _Progress | None = None,
) -> dict[str, Any]:
    envelope = orchestrator.run(contract, options, backend=fake, progress=progress or _Progress())
    return orchestrator.as_json(envelope)


def _category(env: dict[str, Any]) -> str | None:
    return (env.get("failure") or {}).get("category")


@pytest.fixture(autouse=True)
def _virtual_time(virtual_clock: VirtualClock) -> VirtualClock:
    """Every case here runs on a virtual clock (``tests.support.clock``): a fake container's
    seconds, the watch's ticks and heartbeats pass at once, and the ledger's times follow."""
    return virtual_clock


@pytest.fixture
def fake() -> FakeBackend:
    backend = FakeBackend(jobs=FakeJob(work=_writes()))
    backend.add_image()
    return backend


def _image(fake: FakeBackend) -> ImageInfo:
    return next(iter(fake.images.values()))


def test_a_run_that_succeeds(tmp_path: Path, fake: FakeBackend) -> None:
    env = _run(_contract(tmp_path, _image(fake)), _options(tmp_path), fake)
    assert env["status"] == "succeeded", env["failure"]
    assert env["measurements"][0]["value"] == 0.819
    assert env["budget"]["attempts"] == 1
    assert fake.containers == {}  # removed once its end was in the ledger
    ledger = Path(env["jobDir"]) / "record" / "ledger.jsonl"
    assert read_state(ledger).finished is not None
    engine = {"name": "fake", "version": "0", "apiVersion": "1.41"}
    assert env["engine"] == engine  # which engine ran it, in the envelope and the ledger
    assert read_state(ledger).attempts[0].starting["engine"] == engine


# --------------------------------------------------------------------- classification


def _no_fallback(data: dict[str, Any]) -> None:
    data["computeRequirement"]["cpuFallbackAllowed"] = False


def _no_command(data: dict[str, Any]) -> None:
    del data["protocol"]["command"]


def _missing_paper(data: dict[str, Any]) -> None:
    data["paper"]["path"] = "no-such-paper.md"


CASES: list[tuple[str, FakeJob, dict[str, Any], dict[str, Any], Any]] = [
    # category, the fake job, contract environment, options, contract change
    ("nonzero_exit", FakeJob(exit_code=3, work=_writes()), {}, {}, None),
    ("oom", FakeJob(oom_killed=True, work=_writes()), {}, {}, None),
    # the engine's OOMKilled not set (its OOM event came after the exit), the event logged
    ("oom", FakeJob(oom_killed=True, oom_late=True, work=_writes()), {}, {}, None),
    # a job that kills itself with SIGKILL: 137 and no OOM event
    ("nonzero_exit", FakeJob(exit_code=137, work=_writes()), {}, {}, None),
    ("timeout", FakeJob(seconds=INF), {"timeoutMinutes": 1 / 60}, {}, None),
    (
        "disk_quota_exceeded",
        FakeJob(seconds=INF, work=_writes("x" * (2 << 20), "big.bin")),
        {"diskGb": 1 / 1024},
        {},
        None,
    ),
    (
        "log_limit_exceeded",
        FakeJob(seconds=INF, work=_writes("y" * 65536)),
        {"logLimitMb": 1 / 64},
        {"policy": {"logLimitAction": "stop"}},
        None,
    ),
    ("infrastructure", FakeJob(start_error="OCI runtime create failed: exec"), {}, {}, None),
    ("missing_evidence", FakeJob(), {}, {}, None),
    ("parse_error", FakeJob(work=_writes("not json")), {}, {}, None),
    ("gpu_unavailable", FakeJob(), {"gpu": 1}, {"gpu_detector": _OneGpu()}, _no_fallback),
    ("image_unavailable", FakeJob(), {"image": "sha256:" + "1" * 64}, {}, None),
    (
        "image_digest_mismatch",
        FakeJob(),
        {"image": "fake:latest", "imageId": "sha256:" + "0" * 64},
        {"policy": {"allowUnpinnedImages": True}},
        None,
    ),
    ("policy_violation", FakeJob(), {"cpus": 4}, {"policy": {"maxima": {"cpus": 2}}}, None),
    ("protocol_ambiguous", FakeJob(), {}, {}, _no_command),
    ("invalid_contract", FakeJob(), {}, {}, _missing_paper),
    ("signature_invalid", FakeJob(), {}, {"policy": {"acceptUnsigned": False}}, None),
]


@pytest.mark.parametrize(("category", "job", "env", "settings", "change"), CASES)
def test_every_failure_category(
    tmp_path: Path,
    fake: FakeBackend,
    category: str,
    job: FakeJob,
    env: dict[str, Any],
    settings: dict[str, Any],
    change: Callable[[dict[str, Any]], None] | None,
) -> None:
    fake.jobs = job
    contract = _contract(tmp_path, _image(fake), change, **env)
    envelope = _run(contract, _options(tmp_path, **dict(settings)), fake)
    assert _category(envelope) == category, envelope["failure"]
    assert fake.running() == []
    assert (
        orchestrator.failure_exit_family(ResultEnvelope.model_validate(envelope))
        == Category(category).family.label
    )


def test_cancelled_and_resource_exhausted(tmp_path: Path, fake: FakeBackend) -> None:
    """Ctrl-C stops the job (cancelled); a job whose budget is spent starts nothing
    (resource_exhausted)."""
    fake.jobs = FakeJob(seconds=INF)
    contract = _contract(tmp_path, _image(fake), timeoutMinutes=1 / 60)
    env = _run(contract, _options(tmp_path), fake, _Progress(on_running=KeyboardInterrupt))
    assert _category(env) == "cancelled" and env["container"]["stoppedByRunner"]
    assert _category(_run(contract, _options(tmp_path), fake)) == "timeout"
    again = _run(contract, _options(tmp_path, rerun=True), fake)
    assert _category(again) == "resource_exhausted"
    assert _creates(fake) == 2  # the cancelled attempt and the one that timed out


CAPTURED = [
    ("exited-0.json", None),
    ("exited-3.json", "nonzero_exit"),
    ("oom-killed.json", "oom"),
    ("stopped-killed-137.json", "nonzero_exit"),
    ("stopped-sigterm-143.json", "nonzero_exit"),
    ("start-failed.json", "infrastructure"),
]


@pytest.mark.parametrize(("fixture", "category"), CAPTURED)
def test_classification_of_captured_engine_states(fixture: str, category: str | None) -> None:
    """States captured from the real engine (`docker inspect`), classified as the runner does
    when it did not stop the container itself."""
    raw = json.loads((FIXTURES / fixture).read_text())
    outcome = Outcome(ContainerState.from_engine(raw), "id", "name", 1.0, False, False)
    failure = classify(outcome, 60.0)
    assert (failure.category if failure else None) == category


def test_stops_by_the_runner_win_over_the_engine_state() -> None:
    """A container the runner stopped at the deadline reads 137 or 143 to the engine; the
    runner knows why it stopped it, and a quota it found broken comes first."""
    raw = json.loads((FIXTURES / "stopped-sigterm-143.json").read_text())
    state = ContainerState.from_engine(raw)
    timed_out = Outcome(state, "id", "name", 9.0, True, False)
    assert classify(timed_out, 9.0).category == "timeout"  # type: ignore[union-attr]
    quota = replace(timed_out, stopped_for="disk_quota_exceeded")
    assert classify(quota, 9.0).category == "disk_quota_exceeded"  # type: ignore[union-attr]
    cancelled = replace(timed_out, timed_out=False, cancelled=True)
    assert classify(cancelled, 9.0).category == "cancelled"  # type: ignore[union-attr]


# --------------------------------------------------------------------- the resume table


def _crash_mid_run(contract: Path, tmp_path: Path, fake: FakeBackend, **settings: Any) -> None:
    """The runner (run with ``settings``) dies once its container runs: from then on it
    reaches no engine (its clean-up handlers run in this simulation, but the frozen fake
    ignores them)."""

    class _Dies(_Progress):
        def running(self, elapsed: float, budget: float) -> None:
            fake.frozen = True
            raise _Crash

    with pytest.raises(_Crash):
        _run(contract, _options(tmp_path, **settings), fake, _Dies())
    fake.frozen = False


def _creates(fake: FakeBackend) -> int:
    return sum(1 for method, _ in fake.calls if method == "create")


def test_resume_still_running_reattaches(tmp_path: Path, fake: FakeBackend) -> None:
    fake.jobs = FakeJob(seconds=0.5, work=_writes())
    contract = _contract(tmp_path, _image(fake))
    _crash_mid_run(contract, tmp_path, fake)
    assert len(fake.running()) == 1
    env = _run(contract, _options(tmp_path), fake)
    assert env["status"] == "succeeded", env["failure"]
    assert _creates(fake) == 1 and env["budget"]["attempts"] == 1
    assert env["engine"]["name"] == "fake"  # the engine the attempt was recorded with


def test_resume_exited_meanwhile_is_recorded_not_rerun(
    tmp_path: Path, fake: FakeBackend, virtual_clock: VirtualClock
) -> None:
    fake.jobs = FakeJob(seconds=0.1, exit_code=3, work=_writes())
    contract = _contract(tmp_path, _image(fake))
    _crash_mid_run(contract, tmp_path, fake)
    fake.running()  # let it end
    virtual_clock.advance(0.15)
    env = _run(contract, _options(tmp_path), fake)
    assert _category(env) == "nonzero_exit" and env["exitCode"] == 3
    assert _creates(fake) == 1
    ledger = read_state(Path(env["jobDir"]) / "record" / "ledger.jsonl")
    assert ledger.attempts[0].finished is not None
    assert ledger.attempts[0].finished["how"] == "recovered"


def test_resume_vanished_starts_attempt_two(tmp_path: Path, fake: FakeBackend) -> None:
    fake.jobs = FakeJob(seconds=INF, work=_writes())
    contract = _contract(tmp_path, _image(fake), timeoutMinutes=1 / 30)
    _crash_mid_run(contract, tmp_path, fake)
    fake.containers.clear()  # someone removed it
    fake.jobs = FakeJob(work=_writes())
    env = _run(contract, _options(tmp_path), fake)
    assert env["status"] == "succeeded" and env["budget"]["attempts"] == 2
    ledger = read_state(Path(env["jobDir"]) / "record" / "ledger.jsonl")
    assert ledger.attempts[0].finished is not None
    assert ledger.attempts[0].finished["how"] == "vanished"
    assert _creates(fake) == 2


def test_resume_created_never_started_is_removed(tmp_path: Path, fake: FakeBackend) -> None:
    def crash(_: Any) -> None:
        fake.frozen = True
        raise _Crash

    fake.fail["start"] = crash  # the runner dies between create and start
    contract = _contract(tmp_path, _image(fake))
    with pytest.raises(_Crash):
        _run(contract, _options(tmp_path), fake)
    fake.frozen = False
    (left,) = fake.containers.values()
    assert left.status == "created"
    del fake.fail["start"]
    env = _run(contract, _options(tmp_path), fake)
    assert env["status"] == "succeeded" and env["budget"]["attempts"] == 2
    ledger = read_state(Path(env["jobDir"]) / "record" / "ledger.jsonl")
    assert ledger.attempts[0].finished is not None
    assert ledger.attempts[0].finished["how"] == "never-started"


# --------------------------------------------------------------------- budget arithmetic


def _budget_file(env: dict[str, Any]) -> dict[str, Any]:
    path = Path(env["jobDir"]) / "execution" / "runtime-budget.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_attempts_add_up_to_one_budget(tmp_path: Path, fake: FakeBackend) -> None:
    """Two interrupted attempts and a rerun spend one budget; runtime-budget.json and the
    envelope agree with the ledger."""
    limit = 1.5
    fake.jobs = FakeJob(seconds=0.3, work=_writes())
    contract = _contract(tmp_path, _image(fake), timeoutMinutes=limit / 60)
    first = _run(contract, _options(tmp_path), fake)
    assert first["status"] == "succeeded"
    used_once = first["budget"]["consumedSeconds"]
    assert 0.3 <= used_once < limit
    rerun = _run(contract, _options(tmp_path, rerun=True), fake)
    assert rerun["budget"]["attempts"] == 2
    assert rerun["budget"]["consumedSeconds"] >= used_once + 0.3
    budget = _budget_file(rerun)
    assert budget["limitSeconds"] == limit
    assert budget["consumedSeconds"] == rerun["budget"]["consumedSeconds"]
    assert budget["remainingSeconds"] == round(limit - budget["consumedSeconds"], 3)
    fake.jobs = FakeJob(seconds=INF)
    last = _run(contract, _options(tmp_path, rerun=True), fake)
    assert _category(last) == "timeout"
    assert last["budget"]["consumedSeconds"] <= limit + 0.2  # stopped at the total
    assert _budget_file(last)["remainingSeconds"] == max(
        round(limit - last["budget"]["consumedSeconds"], 3), 0.0
    )


def test_a_crash_is_counted_until_now_never_less(
    tmp_path: Path, fake: FakeBackend, virtual_clock: VirtualClock
) -> None:
    fake.jobs = FakeJob(seconds=INF)
    contract = _contract(tmp_path, _image(fake), timeoutMinutes=0.05)
    _crash_mid_run(contract, tmp_path, fake)
    virtual_clock.advance(0.4)
    fake.containers.clear()
    fake.jobs = FakeJob(work=_writes())
    env = _run(contract, _options(tmp_path), fake)
    ledger = read_state(Path(env["jobDir"]) / "record" / "ledger.jsonl")
    assert ledger.attempts[0].seconds >= 0.4  # from the last heartbeat until now
    assert env["budget"]["consumedSeconds"] >= 0.4


class _CtrlCAtStart(FakeBackend):
    """A Ctrl-C that comes while the container starts: ``at`` is "call" (before the engine
    starts it), "answer" (the engine started it, its answer not yet read) or "look" (in the
    look at its StartedAt after the start); ``ran`` seconds pass first."""

    def __init__(self, at: str, ran: float = 2.0, skew: float = 0.0) -> None:
        super().__init__(jobs=FakeJob(seconds=INF))
        self.at, self.ran, self.started, self.skew = at, ran, False, skew

    def start(self, container_id: str) -> None:
        if self.at == "call":
            raise KeyboardInterrupt
        super().start(container_id)
        self.started = True
        for c in self.containers.values():  # an engine whose clock is ``skew`` s ahead
            if c.started_at is not None:
                c.started_at += timedelta(seconds=self.skew)
        if self.at == "answer":
            clock.sleep(self.ran)
            raise KeyboardInterrupt

    def state(self, container_id: str) -> ContainerState:
        if self.at == "look" and self.started:
            self.started = False
            clock.sleep(self.ran)
            raise KeyboardInterrupt
        return super().state(container_id)


@pytest.mark.parametrize(("at", "skew"), [("answer", 0.0), ("look", 0.0), ("answer", 3600.0)])
def test_a_ctrl_c_once_the_engine_started_the_container_charges_its_time(
    tmp_path: Path, at: str, skew: float
) -> None:
    """The container ran from the engine's start: a Ctrl-C in the start call's answer, or
    in the look at its StartedAt, stops it as a cancel does and charges the time it ran
    (it was recorded as never started, charged 0 s, its container removed unstopped). An
    engine whose clock runs ahead is not believed: charged from before the start call."""
    fake = _CtrlCAtStart(at, ran=2.0, skew=skew)
    fake.add_image()
    env = _run(_contract(tmp_path, _image(fake)), _options(tmp_path), fake)
    assert _category(env) == "cancelled"
    assert env["container"] is not None and env["container"]["stoppedByRunner"] is True
    (attempt,) = read_state(Path(env["jobDir"]) / "record" / "ledger.jsonl").attempts
    assert attempt.finished is not None and attempt.finished["how"] != "not-started"
    assert attempt.seconds >= 2.0
    assert env["budget"]["consumedSeconds"] >= 2.0
    assert ("stop", env["container"]["id"]) in fake.calls
    assert fake.running() == [] and fake.containers == {}


class _SlowStart(FakeBackend):
    """An engine that starts the container but answers the start call only after the
    runner's read timeout (``slow`` seconds), or never starts it (``starts=False``)."""

    def __init__(self, slow: float, *, starts: bool = True) -> None:
        super().__init__(jobs=FakeJob(seconds=3.0, work=_writes()))
        self.slow, self.starts = slow, starts

    def start(self, container_id: str) -> None:
        if self.starts:
            super().start(container_id)
        clock.sleep(self.slow)
        raise EngineUnavailable("starting the job container: timed out") from TimeoutError()


def test_a_start_the_engine_answered_too_late_is_watched_and_charged(tmp_path: Path) -> None:
    """The engine started the container but its answer to the start call did not come in
    time: the job runs on, watched and charged from its StartedAt (it was removed as never
    started, the seconds it ran charged 0). One the engine never started is removed and
    charged nothing, as before."""
    fake = _SlowStart(slow=2.0)
    fake.add_image()
    env = _run(_contract(tmp_path, _image(fake)), _options(tmp_path), fake)
    assert env["status"] == "succeeded", env["failure"]
    (attempt,) = read_state(Path(env["jobDir"]) / "record" / "ledger.jsonl").attempts
    assert attempt.seconds >= 3.0 and env["budget"]["consumedSeconds"] >= 3.0
    never = _SlowStart(slow=2.0, starts=False)
    never.add_image()
    other = tmp_path / "never"
    other.mkdir()
    env = _run(_contract(other, _image(never)), _options(other), never)
    assert _category(env) == "infrastructure" and env["container"] is None
    (attempt,) = read_state(Path(env["jobDir"]) / "record" / "ledger.jsonl").attempts
    assert attempt.finished is not None and attempt.finished["how"] == "not-started"
    assert never.containers == {}


class _HungStart(FakeBackend):
    """An engine that hangs on the start call without starting the container, and on the
    look that follows, then answers again: a created container, never started."""

    def __init__(self) -> None:
        super().__init__(jobs=FakeJob(work=_writes()))
        self.hung = True

    def start(self, container_id: str) -> None:
        if not self.hung:
            return super().start(container_id)
        clock.sleep(60.0)
        raise EngineUnavailable("starting the job container: timed out") from TimeoutError()

    def state(self, container_id: str) -> ContainerState:
        if self.hung:
            self.hung = False  # it answers from here on
            raise EngineUnavailable("inspecting the job container: timed out")
        return super().state(container_id)


def test_a_start_the_engine_did_not_answer_nor_tell_of_is_left_in_flight(
    tmp_path: Path,
) -> None:
    """Hostile review of 8dc27cc: neither the start call nor the look after it answered, and
    the container was never started. It is not watched (the engine's wait answers 0 at once
    for a created container: a clean exit, charged, and evidence missing for good): the
    attempt stays in flight, and the next run finds it never started, charged nothing."""
    fake = _HungStart()
    fake.add_image()
    contract = _contract(tmp_path, _image(fake))
    first = _run(contract, _options(tmp_path), fake)
    assert _category(first) == "infrastructure" and first["failure"]["retryable"]
    (attempt,) = read_state(Path(first["jobDir"]) / "record" / "ledger.jsonl").attempts
    assert attempt.finished is None and attempt.seconds == 0.0
    again = _run(contract, _options(tmp_path), fake)
    assert again["status"] == "succeeded", again["failure"]
    lost, ran = read_state(Path(again["jobDir"]) / "record" / "ledger.jsonl").attempts
    assert lost.finished is not None and lost.finished["how"] == "never-started"
    assert lost.seconds == 0.0 and ran.finished is not None
    assert again["budget"]["consumedSeconds"] < 10.0


def test_a_ctrl_c_at_the_start_with_the_engine_gone_leaves_the_attempt_in_flight(
    tmp_path: Path,
) -> None:
    """The engine stops answering as the Ctrl-C comes: whether the container ran is not
    known, so it is neither removed nor charged 0 s; the attempt stays in flight, for the
    next `runner run` to reattach or account for."""
    fake = _CtrlCAtStart("answer")
    fake.add_image()
    gone = EngineUnavailable("the engine did not answer")
    real_start = fake.start

    def start(container_id: str) -> None:
        fake.fail.update(state=gone, stop=gone, remove=gone)
        real_start(container_id)

    fake.start = start  # type: ignore[method-assign]
    env = _run(_contract(tmp_path, _image(fake)), _options(tmp_path), fake)
    assert _category(env) == "infrastructure", env["failure"]
    (attempt,) = read_state(Path(env["jobDir"]) / "record" / "ledger.jsonl").attempts
    assert attempt.finished is None
    assert fake.running() != []


def test_a_ctrl_c_before_the_engine_started_the_container_charges_nothing(
    tmp_path: Path,
) -> None:
    """A Ctrl-C before the engine started it: never started, charged nothing, removed."""
    fake = _CtrlCAtStart("call")
    fake.add_image()
    env = _run(_contract(tmp_path, _image(fake)), _options(tmp_path), fake)
    assert _category(env) == "cancelled" and env["container"] is None
    (attempt,) = read_state(Path(env["jobDir"]) / "record" / "ledger.jsonl").attempts
    assert attempt.finished is not None and attempt.finished["how"] == "not-started"
    assert attempt.seconds == 0.0 and fake.containers == {}


class _LateEngine(FakeBackend):
    """An engine that tells of a container's end ``late`` seconds after it (rootful Podman's
    wait under load told of one 0.65 s after the FinishedAt it then reported): until then
    each wait runs its whole timeout and answers that the container still runs."""

    late: float = 0.7
    told_at: float | None = None

    def wait(self, container_id: str, timeout: float) -> int | None:
        code = super().wait(container_id, timeout)
        if code is None:
            return None
        if self.told_at is None:
            self.told_at = clock.monotonic() + self.late
        left = self.told_at - clock.monotonic()
        if left > 0:
            clock.sleep(min(left, timeout))
            if self.told_at - clock.monotonic() > 0:
                return None
        return code


def _ledger_seconds(tmp_path: Path, env: dict[str, Any]) -> float:
    ledger = tmp_path / "state" / "jobs" / env["jobId"] / "record" / "ledger.jsonl"
    (attempt,) = read_state(ledger).attempts
    assert attempt.finished is not None
    return float(attempt.finished["seconds"])


def test_an_end_the_engine_tells_of_late_is_charged_to_the_engines_own_end(
    tmp_path: Path,
) -> None:
    """A job that ends by itself is charged to the engine's FinishedAt, not to the moment the
    runner learnt of it: 3 s of running, told of 0.7 s late, are 3 s (they were 3.7)."""
    late = _LateEngine(jobs=FakeJob(seconds=3.0, work=_writes()))
    late.add_image()
    env = _run(_contract(tmp_path, _image(late)), _options(tmp_path), late)
    assert env["status"] == "succeeded"
    assert _ledger_seconds(tmp_path, env) == pytest.approx(3.0, abs=0.02)
    assert env["budget"]["consumedSeconds"] == pytest.approx(3.0, abs=0.02)


def _shifted(backend: FakeBackend, seconds: float) -> None:
    """The engine's clock ``seconds`` off this host's: its StartedAt and FinishedAt shifted."""
    real = backend.state

    def state(container_id: str) -> ContainerState:
        st = real(container_id)
        raw = dict(st.raw)
        for key in ("StartedAt", "FinishedAt"):
            when = parse_time(raw.get(key))
            if when is not None:
                raw[key] = (when + timedelta(seconds=seconds)).isoformat()
        return ContainerState.from_engine(raw, container_id)

    backend.state = state  # type: ignore[method-assign]


@pytest.mark.parametrize("skew", [-5.0, 5.0])
def test_an_engine_clock_that_disagrees_is_not_believed_for_the_end(
    tmp_path: Path, skew: float
) -> None:
    """An engine whose clock is 5 s behind (or ahead of) this host's, and late to tell of the
    end: its StartedAt falls outside the start call, so its FinishedAt is not believed and
    the job is charged to the moment the runner learnt of the end, never less than it ran."""
    late = _LateEngine(jobs=FakeJob(seconds=3.0, work=_writes()))
    late.add_image()
    _shifted(late, skew)
    env = _run(_contract(tmp_path, _image(late)), _options(tmp_path), late)
    assert env["status"] == "succeeded"
    assert 3.7 - 0.02 <= _ledger_seconds(tmp_path, env) <= 3.7 + 0.05


@pytest.mark.parametrize(
    ("skew", "heartbeat", "charged"),
    [(0.0, 0.05, 3.0), (-5.0, 0.05, 3.7), (0.0, 10.0, 3.7)],
)
def test_a_reattach_believes_the_engines_end_only_when_its_clock_agrees(
    tmp_path: Path, skew: float, heartbeat: float, charged: float
) -> None:
    """The reattach path: the engine's StartedAt (within a start call that takes 0.2 s, after
    attempt.started, as a real engine's) is where the ledger's last heartbeat puts the start
    (its clock agrees), so an end told of late is charged to FinishedAt; shifted by 5 s it
    is not, nor with no heartbeat to check it by, and the late telling is charged. (It was
    checked against attempt.started, written before the start call: a real engine's
    StartedAt never agreed, and rootful Podman's late telling was charged on every
    reattach.)"""
    late = _LateEngine(jobs=FakeJob(seconds=3.0, work=_writes()), start_seconds=0.2)
    late.add_image()
    contract = _contract(tmp_path, _image(late))
    # kill -9 at its first running tick, after its first heartbeat (or before, at 10 s)
    _crash_mid_run(contract, tmp_path, late, heartbeat_seconds=heartbeat)
    assert len(late.running()) == 1
    if skew:
        _shifted(late, skew)
    env = _run(contract, _options(tmp_path), late)
    assert env["status"] == "succeeded", env.get("failure")
    ledger = tmp_path / "state" / "jobs" / env["jobId"] / "record" / "ledger.jsonl"
    (attempt,) = read_state(ledger).attempts
    assert attempt.finished is not None and attempt.finished["how"] == "reattached"
    assert attempt.finished["seconds"] == pytest.approx(charged, abs=0.1)


def test_a_removal_that_fails_ends_the_job_as_before_the_envelope(
    tmp_path: Path, fake: FakeBackend
) -> None:
    """The ended container is removed while the evidence is read (container.Removal); an
    engine that fails the removal ends the run as it did when the runner waited for it at
    once: an infrastructure failure of the container stage, the attempt's end in the ledger
    and the job not finished (the next run finds the container and removes it)."""
    fake.fail["remove"] = InfrastructureError("removing the job container: the engine said no")
    env = _run(_contract(tmp_path, _image(fake)), _options(tmp_path), fake)
    assert env["status"] == "failed"
    assert env["failure"]["category"] == "infrastructure"
    assert env["failure"]["stage"] == "container"
    assert "the engine said no" in env["failure"]["reason"]
    state = read_state(Path(env["jobDir"]) / "record" / "ledger.jsonl")
    assert state.attempts[0].finished is not None and state.finished is None
    assert env["measurements"] == []  # the envelope of the failure, not of the evidence
    assert [m for m, _ in fake.calls].count("remove") == 1


def test_the_ended_container_is_removed_while_the_evidence_is_read(
    tmp_path: Path, fake: FakeBackend
) -> None:
    """Without an egress allowlist (which must go after its container) the removal runs in a
    thread of its own, joined before the envelope is written: the envelope is the same."""
    removed_by: list[str] = []
    fake.fail["remove"] = lambda _: removed_by.append(threading.current_thread().name)
    env = _run(_contract(tmp_path, _image(fake)), _options(tmp_path), fake)
    assert env["status"] == "succeeded", env["failure"]
    assert removed_by == ["runner-remove"] and fake.containers == {}
    assert "runner-remove" not in {t.name for t in threading.enumerate()}  # joined


def test_a_removal_that_fails_while_the_evidence_fails_too_is_said(
    tmp_path: Path,
    fake: FakeBackend,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The run ends with the evidence's failure; the removal's is logged, not swallowed."""
    fake.fail["remove"] = InfrastructureError("removing the job container: the engine said no")

    def boom(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(orchestrator, "_read_evidence", boom)
    with caplog.at_level(logging.WARNING, logger="runner"):
        env = _run(_contract(tmp_path, _image(fake)), _options(tmp_path), fake)
    assert env["failure"]["stage"] == "parsers"
    said = [r.getMessage() for r in caplog.records if "was not removed" in r.getMessage()]
    assert len(said) == 1 and "the engine said no" in said[0]


class _SlowRemoval(FakeBackend):
    """A removal that takes until ``go`` is set (or fails with ``error``)."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__()
        self.go = threading.Event()
        self.removed: list[str] = []
        self.error = error
        self.after_go = 0.0

    def remove(self, container_id: str) -> None:
        assert self.go.wait(30)
        time.sleep(self.after_go)  # the engine's own time, once asked
        if self.error is not None:
            raise self.error
        self.removed.append(container_id)


def test_without_a_thread_to_be_had_the_container_is_removed_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No thread (the host's limit): removed at once, and a failure is raised where the
    runner waits for the removal (in the container stage), as from the thread."""

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    backend = _SlowRemoval()
    backend.go.set()
    removal = Removal(backend, "c2")
    removal.start()
    assert backend.removed == ["c2"]
    removal.wait()
    failing = _SlowRemoval(InfrastructureError("removing the job container: no"))
    failing.go.set()
    removal = Removal(failing, "c3")
    removal.start()  # raises nothing here
    with pytest.raises(InfrastructureError, match="no"):
        removal.wait()
