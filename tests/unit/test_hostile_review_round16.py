"""The sixteenth hostile review: work that grows faster than what a job, an agent, a contract
or a server wrote. Python's ``re`` tries every way a pattern can match before it gives up, so
an ambiguous pattern takes time growing with the square of its input (or faster):

- ``regex.scalar`` ran the contract's pattern with no bound: ``(\\d+)\\.(\\d+)`` over one line
  of 40,000 digits took 8 s, a line of 1 MiB would take hours; each of a contract's
  measurements (or an envelope's, re-parsed by ``runner verify bundle``) took as long again,
  and a sparse log looked large enough to deserve hours;
- the search of a whole chunk that decides which lines to match ran across lines for a pattern
  that can match a line end (``^\\s*step`` over 100,000 blank lines: 10 s);
- compiling a contract's patterns (0.6 ms a character, no cap on their length or number);
- the runner's own number pattern read ``accuracy: 1111...1x`` (40,000 digits) in 25 s, under
  the most ordinary contract pattern (``accuracy: (\\S+)``);
- the agent's transcript guard searched a long line for JSON strings from every quote
  (64 KB of ``\\"`` took 13 s, in the metering thread, the interpreter's lock held);
- a registry's ``WWW-Authenticate`` header was searched from every letter (64 KiB: 20 s), and
  its token endpoint could trickle its answer for ever; Slurm's ``Key=Value`` lines and a
  credential helper's error were searched the same way;
- ``json.scalar`` compared a pointer's every step at every value (990 deep: 17 s a MiB),
  ``jsonl.scalar`` split its match pointer again on every line, a bundle's scan made the union
  of two sets for every member (80,000 members: 65 s), and the line counter for messages went
  over every skipped stretch for every chunk.

Each is now linear, or bounded: every parse of a job's evidence runs within one CPU budget
(:class:`runner.evidence.read.ParseBudget`, through :mod:`runner.core.cpulimit`), and checking
a contract's parser configs within another. A pattern nested past ``re``'s parser, or with a
repeat count past its range, crashed ``runner contract pin`` as an internal error; it is a
contract error naming the field.

The tests time CPU, not the wall clock, with bounds far above the linear cost and far below
the old one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runner.core.cpulimit import OverCpu, cpu_limit
from runner.core.errors import ContractError, EvidenceParseError
from runner.parsers import registry
from runner.parsers._values import from_text


@pytest.fixture
def quick_limit(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The CPU time for parsing a job's evidence held to half a second (plus what each file
    earns by its size)."""
    from runner.evidence import read

    monkeypatch.setattr(read, "PARSE_SECONDS", 0.5)
    yield


def _parse(log: Path, config: dict[str, Any], parser: str = "regex.scalar") -> object:
    """One parse as the runner makes it: within a ParseBudget."""
    from runner.evidence.read import ParseBudget

    key = (str(log), parser, repr(config))
    return ParseBudget().run("m", log, key, lambda: registry.get(parser, "1").parse(log, config))


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
    start = time.process_time()
    with pytest.raises(EvidenceParseError, match=r"stopped in line 2 after 0\.[56] s") as err:
        _parse(log, {"pattern": r"(\d+)\.(\d+)"})
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
        _parse(log, {"pattern": r"(\d+)\.(\d+)"})
    assert time.process_time() - start < 5


def test_the_bound_leaves_an_ordinary_log_alone(tmp_path: Path, quick_limit: None) -> None:
    """50,000 lines, each searched (no literal to skip by), parse well within half a second
    of CPU, and the timer is disarmed after: nothing fires later."""
    log = tmp_path / "train.log"
    log.write_text("".join(f"step {i} loss={i / 7:.4f}\n" for i in range(50_000)))
    value = _parse(log, {"pattern": r"loss=(\S+)"})
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


# --- the review of the fixes: one budget, and what it did not cover -------------------------


def _regex_measurement(mid: str, pattern: str, path: str = "logs/train.log") -> dict[str, Any]:
    return {
        "measurementId": mid,
        "metric": "accuracy",
        "unit": "fraction",
        "parser": {
            "id": "regex.scalar",
            "version": "1",
            "evidencePath": path,
            "config": {"pattern": pattern},
        },
    }


def test_a_jobs_measurements_share_one_budget(tmp_path: Path, quick_limit: None) -> None:
    """Three measurements that each backtrack over the same line took three times the bound;
    now the first spends the job's parsing time and the others have what is left of it."""
    from runner.contract import verify_data, with_digest
    from runner.evidence.read import read_measurements
    from runner.testing.contracts import toy_data

    output = tmp_path / "output"
    (output / "logs").mkdir(parents=True)
    (output / "logs" / "train.log").write_text("acc 0.5\n" + "7" * 60_000 + "\n")
    data = toy_data()
    data["environment"]["image"] = "sha256:" + "ab" * 32
    data["measurements"] = [_regex_measurement(f"m{c}", r"(\d+)\.(\d+)" + c) for c in "xyz"]
    data = with_digest(data)
    contract = verify_data(data, json.dumps(data).encode(), tmp_path, "test")
    start = time.process_time()
    results, errors = read_measurements(output, contract, 2**30)
    assert time.process_time() - start < 5
    assert results == [] and [e.measurementId for e in errors] == ["mx", "my", "mz"]
    assert "was stopped in its first lines" in errors[0].reason  # the chunk's search
    assert all("s of CPU time" in e.reason or "is spent" in e.reason for e in errors)


def test_a_sparse_log_earns_no_time_for_its_holes(tmp_path: Path) -> None:
    """16 GiB that hold a few KiB on disk earn what those KiB do: the budget stays about its
    base, where the file's size alone would have allowed 4.5 hours. The same parse named twice
    earns once."""
    from runner.evidence.read import PARSE_SECONDS, ParseBudget

    log = tmp_path / "sparse.log"
    with log.open("wb") as f:
        f.write(b"1" * 4096)
        f.truncate(16 * 2**30)
    budget = ParseBudget()
    assert budget._earns(log, ("sparse.log", "regex.scalar", "{}")) < 0.1
    assert budget.allowed < PARSE_SECONDS + 0.1
    dense = tmp_path / "dense.log"
    dense.write_bytes(b"x" * 2**21)
    assert budget._earns(dense, ("dense.log", "regex.scalar", "{}")) == pytest.approx(2, abs=0.1)
    once = budget.allowed
    assert once > PARSE_SECONDS + 1.9
    budget._earns(dense, ("dense.log", "regex.scalar", "{}"))
    assert budget.allowed == once


def test_a_large_file_funds_its_own_parse_only(tmp_path: Path, quick_limit: None) -> None:
    """A job's 64 MiB file added 64 s to the job's time, which a backtracking pattern over a
    one-line log in another measurement could spend: each parse now has the base and what its
    own file earns, at most."""
    from runner.evidence.read import ParseBudget

    big = tmp_path / "big.log"
    big.write_bytes(b"ok 1\n" * (64 * 2**20 // 5))
    small = tmp_path / "small.log"
    small.write_text("7" * 60_000 + "\n")
    budget = ParseBudget()
    config = {"pattern": r"ok (\d+)"}
    key = ("big", "regex.scalar", "a")
    assert budget.run("b", big, key, lambda: registry.get("regex.scalar", "1").parse(big, config))
    slow = {"pattern": r"(\d+)\.(\d+)"}
    start = time.process_time()
    with pytest.raises(EvidenceParseError, match=r"after 0\.[56] s of CPU time"):
        budget.run(
            "s", small, ("small",), lambda: registry.get("regex.scalar", "1").parse(small, slow)
        )
    assert time.process_time() - start < 5


def test_the_chunk_search_does_not_run_across_lines(tmp_path: Path, quick_limit: None) -> None:
    """``^\\s*step\\s+(\\d+)``: ``\\s`` matches a line end, so a search of a whole chunk ran
    over 100,000 blank lines from each of them (10 s, a false failure); matched line by line it
    is 0.04 s, and finds the value."""
    log = tmp_path / "train.log"
    log.write_text("xstep 1\n" + "\n" * 100_000 + "step 7\ny\n")
    start = time.process_time()
    assert _parse(log, {"pattern": r"^\s*step\s+(\d+)"}) == 7
    assert time.process_time() - start < 3


def test_a_contracts_patterns_are_compiled_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Patterns that are slow to compile (case-insensitive, with the widest range), one per
    measurement: refused once checking them takes the bound, naming where it stopped; and a
    pattern over 4,096 characters is refused by the parser's schema."""
    from runner.contract import load

    monkeypatch.setattr(load, "CHECK_SECONDS", 0.3)
    binding = SimpleNamespace(id="regex.scalar", version="1")
    slow = "(?i)(" + "[ -\U0010ffff]" * 40 + ")"
    binding.config = {"pattern": slow}
    start = time.process_time()
    registry.check_binding(binding, path="$.m")
    one = time.process_time() - start
    from runner.contract import verify_data, with_digest
    from runner.testing.contracts import toy_data

    data = toy_data()
    data["environment"]["image"] = "sha256:" + "ab" * 32
    count = max(4, int(3 / max(one, 0.01)))  # several seconds of compiling, unbounded
    data["measurements"] = [_regex_measurement(f"m{i}", f"{slow}{i}") for i in range(count)]
    data = with_digest(data)
    start = time.process_time()
    with pytest.raises(ContractError, match=r"took over 0\.3 s of CPU time") as err:
        verify_data(data, json.dumps(data).encode(), Path("."), "test")
    assert time.process_time() - start < 2.5
    assert err.value.path is not None and err.value.path.startswith("$.measurements[")
    binding.config = {"pattern": "a" * 4097}
    with pytest.raises(ContractError, match="longer than 4096") as err:
        registry.check_binding(binding, path="$.m")


def test_a_failed_measurements_reason_is_cut(tmp_path: Path) -> None:
    """A reason quotes the contract's pattern: kept to 2,000 characters."""
    from runner.contract import verify_data, with_digest
    from runner.evidence.read import REASON_MAX, read_measurements
    from runner.testing.contracts import toy_data

    output = tmp_path / "output"
    (output / "logs").mkdir(parents=True)
    (output / "logs" / "train.log").write_text("nothing\n")
    data = toy_data()
    data["environment"]["image"] = "sha256:" + "ab" * 32
    data["measurements"] = [_regex_measurement("m", "(x)" + "\U0010ffff" * 4000)]
    data = with_digest(data)
    contract = verify_data(data, json.dumps(data).encode(), tmp_path, "test")
    _, errors = read_measurements(output, contract, 2**30)
    assert len(errors[0].reason) == REASON_MAX and errors[0].reason.endswith("...")


def test_cpu_limit_leaves_a_c_profilers_timer_alone() -> None:
    """A profiling timer running with no handler of Python's is a C profiler's (its handler
    takes the signals): the block runs unbounded and the timer is left as it was."""
    signal.setitimer(signal.ITIMER_PROF, 100)
    try:
        with cpu_limit(0.05):
            deadline = time.process_time() + 0.2
            while time.process_time() < deadline:
                pass
        left, _ = signal.getitimer(signal.ITIMER_PROF)
        assert 90 < left < 100
        assert signal.getsignal(signal.SIGPROF) is signal.SIG_DFL
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)


def test_a_deep_json_pointer_costs_one_step_a_value(tmp_path: Path) -> None:
    """``json.scalar`` with a pointer 990 deep into an array of 250,000 numbers: every step of
    the pointer was compared again at every number (8.5 s); now each number costs one."""
    from runner.parsers._json import find_in_stream

    depth = 990
    doc = tmp_path / "deep.json"
    doc.write_text("[" * depth + ",".join(["1"] * 250_000) + "]" * depth)
    start = time.process_time()
    (found,) = find_in_stream(doc, ["/0" * depth])
    assert time.process_time() - start < 3
    assert found.exists and found.value == 1


def test_a_long_match_pointer_is_split_once(tmp_path: Path) -> None:
    """``jsonl.scalar``'s match pointer of 1 MB was split again on each line (56 ms a line)."""
    log = tmp_path / "m.jsonl"
    log.write_text('{"a": 1}\n' * 2000)
    config = {"pointer": "/a", "select": "match", "match": {"pointer": "/k" * 500_000, "value": 1}}
    start = time.process_time()
    with pytest.raises(EvidenceParseError, match="found none"):
        registry.get("jsonl.scalar", "1").parse(log, config)
    assert time.process_time() - start < 5


def test_a_bundles_members_are_counted_as_they_come(tmp_path: Path) -> None:
    """The first pass over a bundle made the union of its member and folder sets for every
    member (80,000: 65 s); now a count kept as it grows. 40,000 members, each its own folder."""
    import io
    import tarfile

    from runner.results.bundle import fixity

    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for i in range(40_000):
            info = tarfile.TarInfo(f"bag/data/d{i}/f")
            tar.addfile(info, io.BytesIO(b""))
    scan = fixity._Scan("b.tar", 2**40, 1_000_000, tmp_path, lambda n, w: RuntimeError(n, w))  # type: ignore[arg-type, return-value]
    start = time.process_time()
    with tarfile.open(fileobj=io.BytesIO(data.getvalue())) as tar:
        for member in tar:
            scan.member(member, tar)
    assert time.process_time() - start < 10
    assert len(scan.names) == 40_000 * 2 + 2  # the files, their folders, bag/ and bag/data


def test_the_line_count_for_a_message_reads_each_stretch_once(tmp_path: Path) -> None:
    """Skipped stretches, one per chunk: each chunk looked at every stretch (quadratic)."""
    from runner.parsers import _lines

    log = tmp_path / "x.log"
    log.write_bytes(b"a\n" * (4096 * 512))
    chunk = 1024
    stretches = [(i, i + chunk) for i in range(0, 4096 * chunk, chunk)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_lines, "CHUNK_BYTES", chunk)
        start = time.process_time()
        counts = _lines._lines_in(log, True, stretches)
        assert time.process_time() - start < 3
    assert counts == [chunk // 2] * 4096


def test_scontrol_fields_and_a_helpers_error_are_read_in_linear_time() -> None:
    from runner.images.registry import _sdk_error_text
    from runner.scheduling.slurm.cluster import parse_fields

    assert _cpu(lambda: parse_fields("a" * 200_000)) < 1
    assert parse_fields("JobId=7 JobState=RUNNING Reason=None") == {
        "JobId": "7",
        "JobState": "RUNNING",
        "Reason": "None",
    }
    assert _cpu(lambda: _sdk_error_text(Exception("StoreError('" * 100_000))) < 1
    said = "Credentials store error: StoreError('docker-credential-x not installed')"
    assert _sdk_error_text(Exception(said)) == "docker-credential-x not installed"


def test_a_registry_that_trickles_its_token_is_given_up_on() -> None:
    """The image's registry (the contract names it) answers 401 with a bearer challenge and
    sends its token a byte a second: each receive is within the timeout, so the probe waited
    for ever. Now each request, its body included, ends within its timeout."""
    from runner.images import registry as images

    digest = "sha256:" + "a" * 64

    def challenge(h: Any) -> None:
        h.send_response(401)
        realm = f"http://127.0.0.1:{h.server.server_address[1]}/t"
        h.send_header("WWW-Authenticate", f'Bearer realm="{realm}"')
        h.send_header("Content-Length", "0")
        h.end_headers()

    def token(h: Any) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "100")
        h.end_headers()
        _trickle(h, b" ", 100, 1.0)

    server = _registry_server({f"/v2/x/y/manifests/{digest}": challenge, "/t": token})
    try:
        ref = images.parse_reference(f"127.0.0.1:{server.server_address[1]}/x/y", digest)
        start = time.monotonic()
        with pytest.raises(images.TransientRegistryError):
            images.probe_once(ref, None, insecure=True, timeout=2)
        assert time.monotonic() - start < 15
    finally:
        server.shutdown()
        server.server_close()


def test_an_over_cpu_caught_by_the_block_is_raised_again() -> None:
    """OverCpu is no Exception (an ``except Exception`` in a parser's fallback swallowed it,
    and the rest of the parse ran unbounded), and the timer fires again while the block goes
    on: code that catches even a BaseException is stopped by the next."""
    from runner.core import cpulimit

    assert not issubclass(OverCpu, Exception)
    caught = 0
    with pytest.raises(OverCpu), cpu_limit(0.1):
        try:
            _spin()
        except OverCpu:
            caught += 1
        _spin()
    assert caught == 1
    assert cpulimit.AGAIN <= 1.0


def test_a_pattern_nested_deep_still_parses(tmp_path: Path) -> None:
    """Alternations nested 250 deep: checked at load, and the walk that decides whether the
    chunk search may be used ran out of recursion (a false failure); now no shortcut."""
    log = tmp_path / "train.log"
    log.write_text("loss 5\n")
    pattern = "(a|" * 250 + r"loss (\d+)" + ")" * 250
    assert _parse(log, {"pattern": pattern, "group": 251}) == 5


def test_a_pattern_turning_multiline_off_is_matched_line_by_line(tmp_path: Path) -> None:
    """``(?-m:^)`` turns off the MULTILINE the chunk search adds: that search saw only the
    chunk's start, skipped the chunks after it, and the first value was taken for the last."""
    log = tmp_path / "train.log"
    log.write_text("loss 1\n" + "filler line\n" * 150_000 + "loss 9\n")
    assert _parse(log, {"pattern": r"(?-m:^)loss (\d+)"}) == 9


def _registry_server(routes: dict[str, Callable[[Any], None]]) -> Any:
    """A loopback HTTP server answering each path with its route (the handler is passed)."""
    import http.server
    import socketserver
    import threading as th

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _route(self) -> None:
            routes[self.path.split("?")[0]](self)

        do_GET = do_HEAD = do_POST = _route

        def log_message(self, *args: object) -> None:
            pass

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Handler)
    th.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


def _redirect(to: str) -> Callable[[Any], None]:
    def answer(h: Any) -> None:
        h.send_response(302)
        h.send_header("Location", to)
        h.send_header("Content-Length", str(50 * 2**20))  # a body it never reads
        h.end_headers()

    return answer


def _trickle(h: Any, piece: bytes, times: int, pause: float) -> None:
    """Send ``piece`` ``times`` times, ``pause`` seconds apart, until the client hangs up."""
    for _ in range(times):
        try:
            h.wfile.write(piece)
            h.wfile.flush()
        except OSError:
            return
        time.sleep(pause)


def _trickle_chunked(h: Any) -> None:
    h.send_response(200)
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    _trickle(h, b"1\r\nx\r\n", 30, 0.5)


def _bad_chunk(h: Any) -> None:
    h.send_response(200)
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    h.wfile.write(b"zz" * 100 + b"\r\n")


def test_a_registrys_odd_answers_are_no_answer() -> None:
    """Each of these ended in an internal error (urllib3's errors, a ValueError, requests'
    redirect and URL errors) or read a redirect's whole body: now each is the registry not
    answering (retried, then image_unavailable), within the request's timeout."""
    import requests

    from runner.images import answers

    server = _registry_server(
        {
            "/trickle": _trickle_chunked,
            "/bad-chunk": _bad_chunk,
            "/loop": _redirect("/loop"),
            "/ftp": _redirect("ftp://127.0.0.1/x"),
            "/bad-location": _redirect("http://[::1"),
        }
    )
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        for path in ("/trickle", "/bad-chunk", "/loop", "/ftp", "/bad-location"):
            with answers.session() as session:
                start = time.monotonic()
                with pytest.raises((requests.ConnectionError, requests.Timeout)):
                    answers.ask(session, "GET", base + path, 2)
                assert time.monotonic() - start < 10, path
    finally:
        server.shutdown()
        server.server_close()


def _here(h: Any) -> None:
    h.send_response(200 if h.command == "HEAD" else 405)
    h.send_header("Content-Length", "0")
    h.end_headers()


def test_a_manifest_check_follows_a_redirect_as_the_engine_does() -> None:
    """A registry (or a mirror before it) that redirects the manifest's HEAD: it is followed,
    still a HEAD (a 303 too), where the check stopped at the 3xx and refused the image as
    "answered 307 ... check the digest" though the engine's own pull follows it."""
    from runner.images import answers

    server = _registry_server(
        {"/here": _here, "/moved": _redirect("/here"), "/see": _moved("/here")}
    )
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        for path in ("/moved", "/see"):
            with answers.session() as session:
                assert answers.ask(session, "HEAD", base + path, 5).status == 200, path
    finally:
        server.shutdown()
        server.server_close()


def _moved(to: str, status: int = 303) -> Callable[[Any], None]:
    """A redirect (``status``) to ``to`` with an empty body."""

    def answer(h: Any) -> None:
        h.send_response(status)
        h.send_header("Location", to)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return answer


def test_a_registry_echoing_the_credentials_is_quoted_without_them() -> None:
    """A registry's error that quotes the request's Authorization header, or a short password
    as it is: its words are left out whole (redacted within, a short password's marks showed
    where it stood, and base64 cores under 8 characters were not looked for)."""
    from runner.images import answers
    from runner.images import registry as images

    creds = images.Credentials("u", "hunter", "test", None)
    secrets = images.secrets_sent(creds)
    for said in ("got Basic dTpodW50ZXI=", "bad password hunter for u", "got bearer xyz"):
        body = json.dumps({"errors": [{"code": "DENIED", "message": said}]}).encode()
        shown = answers.message(answers.Answer(403, "Forbidden", body, ""), secrets)
        assert shown == f"DENIED: {answers.LEFT_OUT}"
    body = json.dumps({"errors": [{"code": "DENIED", "message": "no such repo"}]}).encode()
    assert answers.message(answers.Answer(403, "x", body, ""), secrets) == "DENIED: no such repo"
    assert answers.TOKEN.fullmatch("eyJhbGciOi.J9-_x/+=") and not answers.TOKEN.fullmatch("a\r\nb")


def test_a_redirect_carries_credentials_to_the_same_host_only() -> None:
    from runner.images.answers import keeps_credentials as keeps

    assert keeps("https://r.example/v2/a", "https://r.example/v2/b")
    assert keeps("http://r.example/v2/a", "https://r.example/v2/b")  # an upgrade
    assert not keeps("https://r.example/v2/a", "http://r.example/v2/b")  # to plain http
    assert not keeps("https://r.example/v2/a", "https://r.example:444/v2/b")
    assert not keeps("https://r.example/v2/a", "https://evil.example/v2/b")
    assert not keeps("https://r.example/v2/a", "https://u:p@r.example/v2/b")


def test_a_signal_as_the_block_ends_raises_nothing_after_it() -> None:
    """A SIGPROF handled as ``__exit__`` starts (before it clears the block) raised after the
    block had ended; and ``caught()`` holds the re-fire while a catcher writes why."""
    from runner.core import cpulimit

    limit = cpulimit.cpu_limit(60)
    with limit:
        limit._expired(signal.SIGPROF, SimpleNamespace(f_code=cpulimit._EXIT))  # type: ignore[arg-type]
        with pytest.raises(OverCpu):
            limit._expired(signal.SIGPROF, SimpleNamespace(f_code=_spin.__code__))  # type: ignore[arg-type]
        cpulimit.caught()
        limit._expired(signal.SIGPROF, None)
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
    assert cpulimit._active == []
