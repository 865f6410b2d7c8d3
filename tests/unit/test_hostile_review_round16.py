"""The sixteenth hostile review: regular expressions that backtrack over what a job, an agent
or a server wrote. Python's ``re`` tries every way a pattern can match before it gives up, so
an ambiguous pattern takes time growing with the square of its input (or faster):

- ``regex.scalar`` ran the contract's pattern with no bound: ``(\\d+)\\.(\\d+)`` over one line
  of 40,000 digits took 8 s, a line of 1 MiB would take hours;
- the runner's own number pattern read ``accuracy: 1111...1x`` (40,000 digits) in 25 s, under
  the most ordinary contract pattern (``accuracy: (\\S+)``);
- the agent's transcript guard searched a long line for JSON strings from every quote
  (64 KB of ``\\"`` took 13 s, in the metering thread, the interpreter's lock held);
- a registry's ``WWW-Authenticate`` header was searched from every letter (64 KiB: 20 s);
- a size such as ``--max-bytes`` with spaces on both sides of its number (16,000: 0.9 s).

Each is now linear (possessive repeats, a scanner), and ``regex.scalar``'s matching is bounded
in CPU time (:mod:`runner.core.cpulimit`). A pattern nested past ``re``'s parser, or with a
repeat count past its range, crashed ``runner contract pin`` as an internal error; it is a
contract error naming the field.

The tests time CPU, not the wall clock, with bounds far above the linear cost and far below
the old one."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from runner.core.cpulimit import OverCpu, cpu_limit
from runner.core.errors import ContractError, EvidenceParseError
from runner.parsers import regex_scalar, registry
from runner.parsers._values import from_text


@pytest.fixture
def quick_limit(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """regex.scalar's bound held to half a second (plus the per-MiB part)."""
    monkeypatch.setattr(regex_scalar, "CPU_SECONDS", 0.5)
    yield


def _cpu(action: Callable[[], object]) -> float:
    start = time.process_time()
    with contextlib.suppress(Exception):  # the time is what is measured
        action()
    return time.process_time() - start


# --- regex.scalar: the contract's pattern over the job's log ----------------------------------


def test_a_backtracking_pattern_is_stopped_naming_the_line(
    tmp_path: Path, quick_limit: None
) -> None:
    """``(\\d+)\\.(\\d+)`` over a line of 60,000 digits (about 19 s unbounded): stopped after
    the bound, the error naming line 2 and how to write the pattern instead."""
    log = tmp_path / "train.log"
    log.write_text("epoch 1 acc 0.5\n" + "1" * 60_000 + "\nfinal 0.75\n")
    parser = registry.get("regex.scalar", "1")
    start = time.process_time()
    with pytest.raises(
        EvidenceParseError, match=r"stopped in line 2 after 0\.[56] s of CPU"
    ) as err:
        parser.parse(log, {"pattern": r"(\d+)\.(\d+)"})
    assert time.process_time() - start < 5
    assert err.value.hint is not None and "anchor it" in err.value.hint


def test_a_backtracking_pattern_is_stopped_in_the_prefilter(
    tmp_path: Path, quick_limit: None
) -> None:
    """When the chunk's own search (before any line is matched) is what backtracks, the error
    says so: no line of the log matches, and the search for one never ends."""
    log = tmp_path / "train.log"
    log.write_text("1" * 60_000 + "\n")
    start = time.process_time()
    with pytest.raises(EvidenceParseError, match=r"stopped in its first lines after 0\.[56] s"):
        registry.get("regex.scalar", "1").parse(log, {"pattern": r"(\d+)\.(\d+)"})
    assert time.process_time() - start < 5


def test_the_bound_leaves_an_ordinary_log_alone(tmp_path: Path, quick_limit: None) -> None:
    """50,000 lines, each searched (no literal to skip by), parse well within half a second
    of CPU, and the timer is disarmed after: nothing fires later."""
    log = tmp_path / "train.log"
    log.write_text("".join(f"step {i} loss={i / 7:.4f}\n" for i in range(50_000)))
    value = registry.get("regex.scalar", "1").parse(log, {"pattern": r"loss=(\S+)"})
    assert value == pytest.approx(49_999 / 7, abs=1e-3)
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)


def test_a_patterns_depth_or_repeat_count_is_a_contract_error() -> None:
    """Groups nested past re's parser raised RecursionError, and a repeat count past its range
    OverflowError: `runner contract pin` ended as an internal error. Both name the field."""
    binding = SimpleNamespace(id="regex.scalar", version="1")
    binding.config = {"pattern": "(" * 600 + "a" + ")" * 600}
    with pytest.raises(ContractError, match=r"nests groups deeper") as err:
        registry.check_binding(binding, path="$.m")
    assert err.value.path == "$.m.config.pattern"
    binding.config = {"pattern": "a{99999999999999}"}
    with pytest.raises(ContractError, match=r"not a valid Python regular expression") as err:
        registry.check_binding(binding, path="$.m")
    assert err.value.path == "$.m.config.pattern"


# --- the runner's own patterns over what a job, an agent or a server wrote ----------------------


def test_a_number_the_job_wrote_is_read_in_linear_time() -> None:
    """``accuracy: (\\S+)`` captures a line's 1 MiB of digits and an x: refused as no number
    (25 s for 40,000 digits before; 1 MiB would be hours)."""
    text = "1" * 2**20 + "x"
    with pytest.raises(EvidenceParseError, match="expected a finite number"):
        from_text(text, "number", "log line 1")
    assert _cpu(lambda: from_text(text, "number", "x")) < 1
    assert from_text("-1.5e3", "number", "x") == -1500.0
    assert from_text("+.5", "number", "x") == 0.5
    assert from_text("7.", "number", "x") == 7.0


def test_an_agents_line_of_escaped_quotes_is_counted_in_linear_time() -> None:
    """The transcript guard counts the JSON values of a line over 1 MiB: 16 MiB of ``\\"``
    after a quote (one open string) takes a fraction of a second, not forever."""
    from runner.agents import transcript

    for raw in (b'"' + b'\\"' * (8 * 2**20), b'["a",' * (3 * 2**20)):
        assert _cpu(lambda raw=raw: transcript._values(raw)) < 3  # type: ignore[misc]
    assert transcript._values(b'["a,b", "c:d", {"e": [1, 2]}]') == 8  # keys counted


def test_an_agents_overlong_line_of_quotes_still_breaks_the_guard() -> None:
    """Such a line (4 MiB, a string never closed) fed to the guard's reader: counted, found to
    be no JSON, and the stream called broken, in well under a second of CPU."""
    from runner.agents import transcript

    reader = transcript.Reader()
    line = b'{"type": "x", "pad": "' + b'\\"' * (2 * 2**20)  # never closed
    start = time.process_time()
    reader.feed(line + b"\n")
    assert time.process_time() - start < 3
    assert reader.broken is not None


def test_a_registrys_challenge_is_read_in_linear_time() -> None:
    """A 64 KiB ``WWW-Authenticate`` word without ``="..."``: searched once, not from every
    letter; the parameters of a real challenge are read as before."""
    from runner.images import registry as images

    assert _cpu(lambda: images._CHALLENGE.findall("a" * 2**16 + " " + "b=" * 2**15)) < 1
    real = 'Bearer realm="https://auth.example/token",service="registry",scope="a:b:pull"'
    assert dict(images._CHALLENGE.findall(real)) == {
        "realm": "https://auth.example/token",
        "service": "registry",
        "scope": "a:b:pull",
    }


def test_a_size_or_duration_is_read_in_linear_time() -> None:
    from runner.core import units

    padded = " " * 100_000 + "1" + " " * 100_000 + "x"
    with pytest.raises(units.BadSize):
        units.parse_bytes(padded)
    with pytest.raises(units.BadDuration):
        units.parse_seconds(padded)
    assert _cpu(lambda: units.parse_bytes(padded)) < 1
    assert units.parse_bytes(" 2 GiB ") == 2 * 2**30
    assert units.parse_seconds(" 1.5e1 m") == 900


# --- cpu_limit itself ----------------------------------------------------------------------


def _spin() -> None:
    while True:
        pass


def test_cpu_limit_stops_a_block_and_puts_back_what_was_there() -> None:
    """A profiler's handler and timer are restored when the block ends, the timer less what
    the block used; a SIGPROF after the block goes to that handler, not the block's."""
    seen: list[int] = []
    previous = signal.signal(signal.SIGPROF, lambda signum, frame: seen.append(signum))
    signal.setitimer(signal.ITIMER_PROF, 100)
    try:
        with pytest.raises(OverCpu) as err, cpu_limit(0.2):
            _spin()
        assert err.value.seconds == 0.2
        left, _ = signal.getitimer(signal.ITIMER_PROF)
        assert 90 < left < 100
        os.kill(os.getpid(), signal.SIGPROF)
        assert seen == [signal.SIGPROF]
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def test_cpu_limit_is_quiet_when_the_block_ends_in_time() -> None:
    with cpu_limit(30):
        sum(range(1000))
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGPROF) in (signal.SIG_DFL, None)
    with pytest.raises(ValueError, match="must be positive"), cpu_limit(0):
        pass


def test_cpu_limit_outside_the_main_thread_runs_the_block_unbounded() -> None:
    """Python runs signal handlers in the main thread only; a block elsewhere is not cut."""
    done: list[bool] = []

    def work() -> None:
        with cpu_limit(0.01):
            deadline = time.process_time() + 0.1
            while time.process_time() < deadline:
                pass
            done.append(True)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert done == [True]
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)


def test_a_run_whose_log_backtracks_ends_with_a_parse_error(
    tmp_path: Path, quick_limit: None
) -> None:
    """The whole run (the orchestrator, the fake engine): the job's log holds a line of 60,000
    digits under a contract pattern that backtracks on it; the run ends, its envelope written,
    the measurement a parse error naming the line, within seconds of CPU."""
    from runner.backends.fake import FakeBackend, FakeJob
    from runner.contract import Trust
    from runner.execution import orchestrator
    from runner.planning import policy
    from runner.testing import write_contract

    def work(mounts: dict[str, Path]) -> None:
        log = mounts["/job/output"] / "logs" / "train.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("epoch 1 acc 0.5\n" + "7" * 60_000 + "\n")

    fake = FakeBackend(jobs=FakeJob(work=work))
    (tmp_path / "src").mkdir()
    measurement = {
        "measurementId": "m",
        "metric": "accuracy",
        "unit": "fraction",
        "parser": {
            "id": "regex.scalar",
            "version": "1",
            "evidencePath": "logs/train.log",
            "config": {"pattern": r"(\d+)\.(\d+)"},
        },
    }
    image = fake.add_image().id
    contract = write_contract(tmp_path / "src", image, measurements=[measurement])
    loaded = policy.LoadedPolicy(policy.HostPolicy(acceptUnsigned=True).resolved(), "test")
    options = orchestrator.RunOptions(
        state_dir=tmp_path / "state", policy=loaded, trust=Trust(keys=[]), tick_seconds=0.01,
        heartbeat_seconds=0.05, stop_grace_seconds=0.05,
    )  # fmt: skip
    start = time.process_time()
    envelope = orchestrator.run(contract, options, backend=fake)
    assert time.process_time() - start < 10
    assert envelope.failure is not None and envelope.failure.category == "parse_error"
    assert "stopped in line 2" in envelope.failure.reason
    assert "anchor it" in envelope.failure.reason  # the fix travels with it
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
