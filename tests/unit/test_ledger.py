"""The budget ledger on its own: chain, idempotent ids, torn tails, corruption. Pure files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.state.ledger import Ledger, LedgerCorrupt, read_state, verify_file
from tests.support import run_cli


def _fill(path: Path) -> Ledger:
    led = Ledger.open(path)
    led.append("job.accepted", "job.accepted", {"contractDigest": "sha256:x", "limitSeconds": 60})
    led.append("attempt-1.starting", "attempt.starting", {"attempt": 1, "containerName": "c1"})
    led.append("attempt-1.started", "attempt.started", {"attempt": 1, "containerId": "id1"})
    for i in range(3):
        led.append(
            f"attempt-1.beat-{i}",
            "heartbeat",
            {"attempt": 1, "attemptSeconds": i + 1.0, "consumedSeconds": i + 1.0},
        )
    return led


def test_reopened_ledger_keeps_its_state(tmp_path: Path) -> None:
    """Consumption and the attempt in flight are derived again from the file."""
    path = tmp_path / "ledger.jsonl"
    _fill(path)
    state = Ledger.open(path).state
    assert state.consumed == 3.0
    assert state.in_flight is not None and state.in_flight.container_id == "id1"
    assert verify_file(path) == []


def test_same_event_id_is_idempotent(tmp_path: Path) -> None:
    """Appending the same event again is a no-op; the same id with other data is refused."""
    path = tmp_path / "ledger.jsonl"
    led = _fill(path)
    size = path.stat().st_size
    led.append(
        "attempt-1.beat-2",
        "heartbeat",
        {"attempt": 1, "attemptSeconds": 3.0, "consumedSeconds": 3.0},
    )
    assert path.stat().st_size == size
    with pytest.raises(LedgerCorrupt, match="other content"):
        led.append(
            "attempt-1.beat-2",
            "heartbeat",
            {"attempt": 1, "attemptSeconds": 9.0, "consumedSeconds": 9.0},
        )


def test_events_out_of_order_are_refused(tmp_path: Path) -> None:
    led = _fill(tmp_path / "ledger.jsonl")
    with pytest.raises(LedgerCorrupt, match="in flight"):
        led.append("attempt-2.starting", "attempt.starting", {"attempt": 2, "containerName": "c"})
    with pytest.raises(LedgerCorrupt, match="not in flight"):
        led.append("attempt-5.finished", "attempt.finished", {"attempt": 5, "seconds": 1})


def test_torn_last_line_is_kept_aside_and_cut(tmp_path: Path) -> None:
    """A half-written last line is preserved byte for byte, then truncated before appending."""
    path = tmp_path / "ledger.jsonl"
    _fill(path)
    torn = b'{"schemaVersion":"1.0","seq":6,"eventId":"attempt-1.be'
    with path.open("ab") as f:
        f.write(torn)
    assert verify_file(path)[-1].message == "incomplete last line (a torn write)"
    assert read_state(path).consumed == 3.0
    led = Ledger.open(path)
    (side,) = tmp_path.glob("ledger.jsonl.torn-*")
    assert side.read_bytes() == torn
    led.append(
        "attempt-1.beat-9",
        "heartbeat",
        {"attempt": 1, "attemptSeconds": 4.0, "consumedSeconds": 4.0},
    )
    assert verify_file(path) == []
    assert Ledger.open(path).state.consumed == 4.0


def test_modified_middle_line_fails_verification(tmp_path: Path) -> None:
    """Changing a recorded heartbeat breaks the chain at the next line; nothing is skipped."""
    path = tmp_path / "ledger.jsonl"
    _fill(path)
    lines = path.read_bytes().splitlines()
    lines[3] = lines[3].replace(b'"attemptSeconds":1.0', b'"attemptSeconds":0.1')
    path.write_bytes(b"\n".join(lines) + b"\n")
    problems = verify_file(path)
    assert [p.line for p in problems] == [5]
    assert "line 4 was changed" in problems[0].message
    with pytest.raises(LedgerCorrupt, match="line 5"):
        Ledger.open(path)
    job = tmp_path / "job"
    (job / "record").mkdir(parents=True)
    path.rename(job / "record" / "ledger.jsonl")
    proc = run_cli("ledger", "verify", str(job))
    assert proc.returncode == 1
    assert "line 5: chain broken" in proc.stdout


def test_garbage_middle_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    _fill(path)
    lines = path.read_bytes().splitlines()
    lines.insert(2, b"not json")
    path.write_bytes(b"\n".join(lines) + b"\n")
    messages = [str(p) for p in verify_file(path)]
    assert messages[0].startswith("line 3: not a ledger event")


def test_ledger_verify_passes_an_intact_ledger(tmp_path: Path) -> None:
    job = tmp_path / "job"
    (job / "record").mkdir(parents=True)
    _fill(job / "record" / "ledger.jsonl")
    proc = run_cli("ledger", "verify", str(job), "--json")
    assert proc.returncode == 0, proc.stdout
    assert json.loads(proc.stdout)["events"] == 6


@pytest.mark.parametrize(
    ("text", "micro"),
    [
        ("2026-11-29T21:27:14.123456789Z", 123456),
        ("2026-11-29T21:27:14Z", 0),
        ("2026-11-29T21:27:14.5+00:00", 500000),
    ],
)
def test_engine_times_parse_with_their_zone(text: str, micro: int) -> None:
    """Engine times carry nanoseconds and a zone; both survive parsing."""
    from runner.state.ledger import parse_time

    parsed = parse_time(text)
    assert parsed is not None and parsed.utcoffset() is not None
    assert parsed.microsecond == micro
    assert parse_time("0001-01-01T00:00:00Z") is None
