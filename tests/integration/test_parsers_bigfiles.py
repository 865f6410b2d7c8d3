"""Big evidence files are parsed with bounded memory (peak RSS growth measured, not time)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from runner.parsers import registry

pytestmark = pytest.mark.slow  # 1 GiB inputs written and parsed

GIB = 1024 * 1024 * 1024
MIB = 1024 * 1024
LIMIT = 200 * MIB  # the bound the parsers promise
WELL_UNDER = 64 * MIB  # what these tests hold them to


def _write_big(path: Path, head: bytes, line: bytes, tail: bytes, size: int = GIB) -> None:
    """``head``, then ``line`` repeated in 1 MiB blocks up to ``size`` bytes, then ``tail``."""
    block = line * (MIB // len(line))
    with path.open("wb") as fh:
        fh.write(head)
        for _ in range(size // len(block)):
            fh.write(block)
        fh.write(tail)


@dataclass(frozen=True)
class Measured:
    value: Any
    growth: int  # peak RSS during the parse minus RSS just before it
    peak: int
    seconds: float


def _measure(parse: Callable[[], Any]) -> Measured:
    """Run ``parse()`` while sampling this process's RSS every 5 ms."""
    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = base
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, proc.memory_info().rss)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.monotonic()
    try:
        value = parse()
    finally:
        seconds = time.monotonic() - start
        done.set()
        sampler.join()
    peak = max(peak, proc.memory_info().rss)
    return Measured(value, peak - base, peak, seconds)


@pytest.fixture
def big_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "big.evidence"
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def _report(name: str, path: Path, m: Measured) -> None:
    print(  # shown with `pytest -s`
        f"\n{name}: {path.stat().st_size / GIB:.2f} GiB in {m.seconds:.1f} s, peak RSS growth "
        f"{m.growth / MIB:.1f} MiB (peak RSS {m.peak / MIB:.0f} MiB)"
    )


def test_regex_scalar_reads_a_1_gib_log_in_bounded_memory(big_file: Path) -> None:
    """regex.scalar finds the last value of a 1 GiB log while RSS grows well under 200 MB."""
    line = b"epoch 3 step 123456 loss=0.4321 lr=0.0001 throughput=1234.5 samples/s\n"
    _write_big(big_file, b"start\n", line, b"final accuracy=0.8190\nbye\n")
    parser = registry.get("regex.scalar", "1")
    m = _measure(lambda: parser.parse(big_file, {"pattern": r"^final accuracy=(\S+)$"}))
    _report("regex.scalar", big_file, m)
    assert m.value == 0.819
    assert m.growth < WELL_UNDER


def test_json_scalar_reads_a_1_gib_document_in_bounded_memory(big_file: Path) -> None:
    """json.scalar finds a pointer at the end of a 1 GiB document without loading it."""
    record = json.dumps({"id": 7, "text": "x" * 900, "scores": [0.25, 0.5]}).encode() + b","
    _write_big(
        big_file,
        b'{"predictions": [',
        record,
        b'{"id": 0}], "metrics": {"accuracy": 0.819, "n": 10000}}',
    )
    parser = registry.get("json.scalar", "1")
    m = _measure(lambda: parser.parse(big_file, {"pointer": "/metrics/accuracy"}))
    _report("json.scalar", big_file, m)
    assert m.value == 0.819
    assert m.growth < WELL_UNDER


def test_jsonl_scalar_reads_a_1_gib_log_in_bounded_memory(big_file: Path) -> None:
    """jsonl.scalar matches the one test record at the end of a 1 GiB log in bounded memory."""
    record = json.dumps({"split": "train", "step": 1, "loss": 0.5, "note": "y" * 900}).encode()
    _write_big(
        big_file,
        b"",
        record + b"\n",
        b'{"split": "test", "accuracy": 0.819}\n',
    )
    parser = registry.get("jsonl.scalar", "1")
    config = {
        "pointer": "/accuracy",
        "select": "match",
        "match": {"pointer": "/split", "value": "test"},
        "occurrence": "only",
    }
    m = _measure(lambda: parser.parse(big_file, config))
    _report("jsonl.scalar", big_file, m)
    assert m.value == 0.819
    assert m.growth < WELL_UNDER


def test_a_1_gib_file_without_newlines_is_refused_in_bounded_memory(big_file: Path) -> None:
    """A 1 GiB log that is one line is refused at the line cap, never loaded."""
    _write_big(big_file, b"", b"accuracy=0.8 " * 64, b"")
    parser = registry.get("regex.scalar", "1")

    def parse() -> str:
        try:
            parser.parse(big_file, {"pattern": r"accuracy=(\S+)"})
        except Exception as exc:  # noqa: BLE001 - returned and checked below
            return str(exc)
        return "no error"

    m = _measure(parse)
    _report("regex.scalar, one endless line", big_file, m)
    assert "line 1 is longer than 1 MiB" in m.value
    assert m.growth < WELL_UNDER
