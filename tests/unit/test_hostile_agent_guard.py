"""Regression tests for the agent's turn and cost guard (issue 25, items 2, 3 and 12).

Before: the guard read the transcript from ``/job/output``, which the job can write, so a
runaway agent that deleted it (or put a link to /dev/null in its place) ran its whole time
budget with ``stoppedFor: null``; the reader kept every distinct message id whole, so a
transcript of long ids grew the runner's memory with the job's input; turns were the higher
of the answers seen and the runtime's ``num_turns`` (one more than the answers at Claude
Code's --max-turns); the ledger's ``agent.usage`` had ``requests: null`` where the envelope
had the proxy's count. Now the guard reads the runner's own capture of the container's stdout
(outside every folder the job can reach), floors turns by the egress proxy's count of model
requests, live, and fails closed when a transcript it read vanishes or is replaced.

The tests that need the engine are in tests/integration/test_hostile_agent_guard.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.agents import transcript

# --- item 2, fail closed: the meter on a file that is replaced ------------------------------------


def test_a_transcript_that_vanishes_shrinks_or_becomes_a_link_fails_closed(tmp_path: Path) -> None:
    """A transcript file the meter has read that vanishes, shrinks, or is replaced by another
    file or a link stops the agent (agent.transcript), keeping the turns it had read."""
    line = (json.dumps({"type": "assistant", "message": {"id": "a"}}) + "\n").encode()
    other = line.replace(b'"a"', b'"b"')
    tampers = {
        "vanished": lambda p: p.unlink(),
        "shrank": lambda p: p.write_bytes(b""),
        "replaced": lambda p: (p.unlink(), p.write_bytes(other * 3)),
        "rewritten": lambda p: p.write_bytes(other * 3),
        "link": lambda p: (p.unlink(), p.symlink_to("/dev/null")),
    }
    for name, tamper in tampers.items():
        root = tmp_path / name
        root.mkdir()
        path = root / "t.jsonl"
        path.write_bytes(line)
        meter = transcript.Meter(root, "t.jsonl")
        assert meter.poll().over(5, None) is None
        tamper(path)
        usage = meter.poll()
        assert usage.turns == 1 and usage.tampered, name
        assert usage.over(5, None) == transcript.TAMPERED, name


# --- item 12: a broken download's hint carries the answers ---------------------------------------


def test_a_failed_download_names_each_sources_answer_in_its_hint(tmp_path: Path) -> None:
    """Before: the hint said "its answer is listed above", pointing at nothing where the hint is
    shown on its own (the envelope, --json). Now message and hint both carry each source with
    its answer."""
    from runner.caches.assets import AssetCache, fetch
    from runner.core.errors import AssetUnavailable
    from tests.unit.test_hostile_asset_sources import _asset, _grant

    with pytest.raises(AssetUnavailable) as raised:
        fetch(_asset("missing/blob.bin"), tmp_path, AssetCache(tmp_path / "c"), _grant())
    err = raised.value
    assert "missing/blob.bin" in err.message
    assert "listed above" not in (err.hint or "")
    assert "1 source(s) tried" in (err.hint or "") and "missing/blob.bin" in (err.hint or "")
