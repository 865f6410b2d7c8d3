"""The hostile review of issue 25's fixes (third round): each hole found, as a regression
test. The agent guard, the redaction step, the input cache and the tools they touch, attacked
as a hostile job, agent prompt, contract author and local user would.

The tests that need the engine are in tests/integration/test_hostile_review_round3.py."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from runner.agents import transcript
from runner.core.redaction import REDACTED, Redactor
from tests.support.hostile import record
from tests.unit.test_hostile_secrets import KEY, holding

MARK = REDACTED.format(name="API_KEY")

# --- redaction: what the prefilter must not hide, and hex as xxd prints it -----------------


def _encoded(before: bytes) -> dict[str, bytes]:
    raw = before + KEY.encode()
    hexed = raw.hex()
    return {
        "url": "".join(f"%{b:02x}" for b in raw).encode(),
        "url-mixed": b"".join(
            f"%{b:02X}".encode() if i % 2 else bytes([b]) for i, b in enumerate(raw)
        ),
        "hex-mixed-case": "".join(c.upper() if i % 3 else c for i, c in enumerate(hexed)).encode(),
        "base64-wrapped": base64.encodebytes(raw * 3),
        "xxd -p": "\n".join(hexed[i : i + 60] for i in range(0, len(hexed), 60)).encode(),
        "xxd -p, CRLF": "\r\n".join(hexed[i : i + 60] for i in range(0, len(hexed), 60)).encode(),
    }


@pytest.mark.hostile
@pytest.mark.parametrize("stray", [b"%\r", b"x%\r\r", b"%\r \t"], ids=["pct-cr", "cr-cr", "cr-ws"])
def test_a_stray_percent_and_carriage_return_does_not_hide_the_value(stray: bytes) -> None:
    """Before: the prefilter percent-decoded with quoted-printable's decoder, which drops
    everything after "=" and a lone CR; a "%\\r" anywhere before the value (one in a whole
    1 MiB read) hid every percent-encoded, mixed-case hex or wrapped base64 form of it that
    followed, and the value went into the file (a transcript, the bundle) in clear."""
    redactor = Redactor({"API_KEY": KEY})
    for before in (b"", b"a", b"ab"):
        for name, form in _encoded(before).items():
            data = stray + b" some log text " + form + b" done\n"
            assert redactor.found(data) == ["API_KEY"], (name, data)
            out = redactor.bytes(data)
            assert holding(out) == [] and MARK.encode() in out, (name, out)


@pytest.mark.hostile
def test_hex_wrapped_as_xxd_prints_it_is_found() -> None:
    """Before: hex was found only on one line; ``xxd -p`` (60 digits a line) of the key, as an
    agent's tool prints it into its transcript, was kept whole."""
    redactor = Redactor({"API_KEY": KEY})
    hexed = ("== " + KEY + " ==").encode().hex()
    for width in (60, 32, 7):
        text = "\n".join(hexed[i : i + width] for i in range(0, len(hexed), width)).encode()
        assert redactor.found(text) == ["API_KEY"], width
        out = redactor.bytes(text)
        assert MARK.encode() in out, width
        assert KEY.encode().hex().encode() not in out.replace(b"\n", b""), width


# --- the guard: bytes written into the runtime's own stdout ---------------------------------


def test_junk_before_each_answer_fails_the_reader_closed() -> None:
    """Before: a line that did not parse was skipped, so bytes without a line break written
    into the runtime's stdout just before each of its lines hid every answer (no turn, no
    token counted, nothing said). Now a line that is no JSON object fails the guard closed;
    only the first line after a restart (a stream that may begin inside a line) is not
    judged."""
    answer = b'{"type": "assistant", "message": {"id": "m%d", "usage": {"output_tokens": 9}}}\n'
    reader = transcript.Reader(transcript.Prices(output=1.0))
    for i in range(5):
        reader.feed(b"xxxx" + answer % i)
    usage = reader.usage()
    assert usage.turns == 0  # the answers are hidden ...
    assert usage.tampered and "no JSON object" in usage.tampered  # ... and that is said
    assert usage.over(3, None) == transcript.TAMPERED
    clean = transcript.Reader()
    clean.feed(answer % 1)
    clean.restart()
    clean.feed(b'ssage": {"id": "m1"}}\n' + answer % 2)
    assert clean.usage().tampered is None and clean.usage().turns == 2


# --- the guard: an over-long line in the runtime's stdout -------------------------------------


def test_an_answer_merged_into_a_line_over_a_mib_is_counted_or_fails_closed() -> None:
    """Before: a line over 1 MiB was skipped without a word, so a job writing 1 MiB + 1
    bytes (no line break) into the runtime's stdout before each answer hid every answer.
    Now lines up to 16 MiB are read (junk before an answer: no JSON object, fail closed), a
    longer one fails the guard closed, naming why without quoting it; only a restarted
    stream's first line is not judged."""
    answer = b'{"type": "assistant", "message": {"id": "m%d", "usage": {"output_tokens": 9}}}\n'
    old_cap = 1024 * 1024
    merged = transcript.Reader()
    for i in range(3):
        merged.feed(b"x" * (old_cap + 1) + answer % i)
    usage = merged.usage()
    assert usage.tampered and "no JSON object" in usage.tampered, usage
    assert usage.over(10, None) == transcript.TAMPERED
    big = transcript.Reader()  # a long line a runtime could print: read, counted
    pad = b"p" * (4 * old_cap)
    big.feed(b'{"type": "assistant", "message": {"id": "m1", "pad": "' + pad + b'"}}\n')
    assert big.usage().turns == 1 and big.usage().tampered is None
    over = transcript.Reader()
    for _ in range(transcript.LINE_MAX // old_cap + 1):
        over.feed(b"x" * old_cap)  # in pieces, as a stream comes
    over.feed(b"\n" + answer % 9)
    usage = over.usage()
    assert usage.tampered and "over 16 MiB" in usage.tampered and "xxx" not in usage.tampered
    assert usage.turns == 1 and usage.over(10, None) == transcript.TAMPERED
    restarted = transcript.Reader()
    restarted.restart()  # may begin inside a line: its first is not judged
    restarted.feed(b"x" * (transcript.LINE_MAX + 1) + b"\n" + answer % 1)
    assert restarted.usage().tampered is None and restarted.usage().turns == 1


_LONG_LINES = r"""
import json, resource, sys
from runner.agents import transcript

def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

unit = {"text": b"i", "lists": b"[],", "strings": b'"ab",'}[sys.argv[1]]
step = 1024 * 1024
body = unit * (step // len(unit))
reader = transcript.Reader()
reader.feed(b'{"type": "assistant", "message": {"id": "warm"}}\n')
base = rss()
for i in range(6):  # lines just under the cap, fed as a stream comes, a MiB a time
    if unit == b"i":  # a distinct id of almost 16 MiB
        reader.feed(b'{"type": "assistant", "message": {"id": "%d' % i)
    else:  # an answer with a value of 16 MiB of tiny JSON values
        reader.feed(b'{"type": "assistant", "message": {"id": "%d"}, "x": [' % i)
    for _ in range(transcript.LINE_MAX // step - 1):
        reader.feed(body)
    reader.feed(b'"}}\n' if unit == b"i" else b"0]}\n")
for _ in range(2):  # and lines past the cap
    for _ in range(transcript.LINE_MAX // step + 2):
        reader.feed(body)
    reader.feed(b"\n")
usage = reader.usage()
print(json.dumps({"turns": usage.turns, "grew": rss() - base, "tampered": usage.tampered}))
"""


@pytest.mark.parametrize("lines", ["text", "lists", "strings"])
def test_the_readers_memory_stays_bounded_with_lines_up_to_its_cap(lines: str) -> None:
    """Lines up to the 16 MiB cap are kept whole to be read: a fresh process feeding distinct
    ids just under the cap, or lines of as many tiny JSON values (parsed, each would be a
    Python object: hundreds of MB; a line over 1 MiB with more than 100,000 values fails
    closed), then lines past the cap, grows its peak RSS by under 100 MB (issue 25, item
    3's bound)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _LONG_LINES, lines], capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    record(f"transcript-reader-long-lines-{lines}", "none", {}, **got)
    assert got["turns"] == (7 if lines == "text" else 1) and got["tampered"], got
    if lines != "text":
        assert "100,000 JSON values" in got["tampered"], got
    assert got["grew"] < 100 * 1024 * 1024, got


# --- the working copy: a cached file changed after the stamp check --------------------------


def test_a_cached_file_changed_before_the_working_copy_is_refused(tmp_path: Path) -> None:
    """The input cache's files are linked into input/ after their stamps are checked; a local
    user edits one then (same size, mtime put back), so the job's working copy
    (workspace/repository) gets the edited code, and restores it before the run ends, so the
    re-hash of input/ after the job passes. Before: the copy was made unchecked and the run
    `succeeded` on the edited code. Now the copy hashes what it copies against the listing
    of input/ as staged: input_digest_mismatch, naming the file, nothing left in workspace/."""
    from runner.caches import inputcache
    from runner.caches.inputcache import InputCache
    from runner.contract import load_contract
    from runner.core.errors import InputDigestMismatch
    from runner.execution import layout
    from runner.staging import jobdir as staging
    from runner.state.jobdir import StateDir
    from tests.unit.test_hostile_inputs_round3 import _swap, _value_contract

    contract = load_contract(_value_contract(tmp_path / "c", "sha256:" + "ab" * 32))
    state = StateDir(tmp_path / "state")
    cache = InputCache.of_state(state.root)
    cases = (("edited", "change"), ("added", "add"), ("linked", "link"), ("clean", None))
    for name, tamper in cases:
        job = staging.prepare(state.job(name).root)
        staging.stage_inputs(job, contract, via=inputcache.stager(cache, job))
        value = job.input / "repository" / "value.txt"
        if tamper == "change":
            _swap(value, b"0.9\n")  # the cached inode: in every job that links it
        elif tamper == "add":
            os.chmod(value.parent, 0o700)
            (value.parent / "extra.py").write_text("print('not staged')\n")
        elif tamper == "link":
            os.chmod(value.parent, 0o700)
            (value.parent / "extra.py").symlink_to("value.txt")
        if tamper is None:
            assert layout.working_copy(job, contract, 1 << 40)
            assert (job.workspace / "repository" / "value.txt").read_text() == "0.1\n"
            continue
        with pytest.raises(InputDigestMismatch, match=r"repository\.path.*input/repository/"):
            layout.working_copy(job, contract, 1 << 40)
        assert list(job.workspace.iterdir()) == [], name
        if tamper == "change":
            _swap(value, b"0.1\n")  # put back: as a user covering the change would
        else:
            (value.parent / "extra.py").unlink()


# --- the re-hash of input/ after the job: its listing unreadable ------------------------------


def test_an_unreadable_listing_of_the_staged_inputs_fails_the_check_closed(
    tmp_path: Path,
) -> None:
    """Before: record/input-tree.json missing or not the runner's listing made the re-hash
    of input/ after the job return unchanged=None, and the run went on (succeeded). Now it
    is unchanged=False, naming the file: the run is input_digest_mismatch (its inputs cannot
    be shown to be what the contract binds, so no value is a result)."""
    from runner.contract import load_contract
    from runner.staging import jobdir as staging
    from tests.unit.test_hostile_inputs_round3 import _value_contract

    contract = load_contract(_value_contract(tmp_path / "c", "sha256:" + "ab" * 32))
    job = staging.prepare(tmp_path / "job")
    staging.stage_inputs(job, contract)
    assert staging.recheck_inputs(job).unchanged is True
    tree = job.record / "input-tree.json"
    good = tree.read_bytes()
    for broken in (b"", b"{}", b'{"listing": 7, "inputs": []}', None):
        if broken is None:
            tree.unlink()
        else:
            tree.write_bytes(broken)
        checked = staging.recheck_inputs(job)
        assert checked.unchanged is False, broken
        assert "record/input-tree.json" in str(checked.problem), checked
    tree.write_bytes(good)
    assert staging.recheck_inputs(job).unchanged is True
