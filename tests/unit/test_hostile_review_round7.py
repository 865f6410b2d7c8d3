"""The seventh hostile review (the changes since dac56f3, and what they lead to): what it found,
kept closed. No engine: hostile bundles are written here as a hostile exporter could, and a
hostile engine is a loopback Unix-socket server."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import socket
import tarfile
import tempfile
import threading
from pathlib import Path

import pytest

from runner.results.bundle.verify import Keys, verify
from tests.support.engine_socket import UnixEngine

pytestmark = pytest.mark.hostile


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _bag_fetching(path: Path, size: str, encoding: str = "UTF-8") -> Path:
    """An unsealed .tar.gz bag whose fetch.txt stores data/blob.bin beside it, with ``size``
    as its size field (tag manifest and Payload-Oxum as an exporter writes them), its tag
    files' encoding as bagit.txt names it ``encoding``."""
    blob = b"zz"
    files = {
        "data/result.json": b"{}",
        "bagit.txt": f"BagIt-Version: 1.0\nTag-File-Character-Encoding: {encoding}\n".encode(),
        "bag-info.txt": b"Payload-Oxum: 4.2\nBagging-Date: 2026-12-01\n",
        "manifest-sha256.txt": (
            f"{_sha(b'{}')}  data/result.json\n{_sha(blob)}  data/blob.bin\n".encode()
        ),
        "runner-bundle.json": b'{"kind": "runner.bundle-info"}',
        "fetch.txt": f"file:sha256/{_sha(blob)} {size} data/blob.bin\n".encode(),
    }
    tags = "".join(f"{_sha(data)}  {name}\n" for name, data in files.items() if "/" not in name)
    files["tagmanifest-sha256.txt"] = tags.encode()
    with tarfile.open(path, "w:gz") as tar:
        for folder in ("b", "b/data"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(f"b/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize(
    "size",
    ["\u00b2", "\u0662", "9" * 5000],
    ids=["superscript-two", "arabic-indic-two", "5000-digits"],
)
def test_a_fetch_txt_size_in_non_ascii_digits_is_a_problem_not_a_crash(
    tmp_path: Path, size: str
) -> None:
    """fetch.txt's size field is checked with str.isdigit(), which holds for '²' (int() then
    raised ValueError out of `runner verify bundle`: a traceback, no report) and for '٢'
    (read as 2: a size no exporter writes, accepted); ASCII digits past Python's 4,300 raised
    the same ValueError. Each is now a fetch.txt problem."""
    archive = _bag_fetching(tmp_path / "b.bag.tar.gz", size)
    report = verify(archive, keys=Keys([], []), allow_untrusted=True)
    payload = next(c for c in report.checks if c.name == "payload")
    assert payload.status == "failed", payload
    assert any(
        p.file == "fetch.txt" and "by its digest and size" in p.message for p in report.problems
    ), report.problems


class _TricklingEngine(UnixEngine):
    """An Engine API on a Unix socket that answers ``/_ping`` at once and every other request
    with a head at once and then its body a byte at a time, each byte within the client's
    per-read timeout (so that no single read ever times out)."""

    def __init__(self, path: Path, per_byte: float) -> None:
        self.per_byte = per_byte
        super().__init__(path)

    def answer(self, conn: socket.socket, line: bytes) -> None:
        ping = b"/_ping" in line
        body = b"OK" if ping else json.dumps({"Version": "x" * 4096}).encode()
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nAPI-Version: 1.45\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + (body if ping else b"")
        )
        if not ping:
            for i in range(len(body)):
                if self.closed.wait(self.per_byte):
                    return
                conn.sendall(body[i : i + 1])


def test_an_engine_that_trickles_its_answer_is_given_up_on_within_the_calls_timeout() -> None:
    """The engine's answers were read with a timeout on each receive only: an engine (or
    whatever DOCKER_HOST names) sending a byte every 0.2 s held the runner for as long as it
    liked (here 4 KiB: about 14 minutes; `runner --version`, which asks it "within a second",
    as long). The body is now read within the call's timeout in all: a TimeoutError, as the
    engine's failure, within a few seconds of a 1 s timeout."""
    from runner.backends.docker import DockerBackend
    from runner.core.errors import EngineUnavailable

    folder = Path(tempfile.mkdtemp(prefix="r7-", dir="/tmp"))  # a socket's path: short
    engine = _TricklingEngine(folder / "engine.sock", per_byte=0.2)
    outcome: list[BaseException | object] = []

    def ask() -> None:
        try:
            outcome.append(DockerBackend(f"unix://{engine.path}", timeout=1.0).engine())
        except BaseException as exc:  # noqa: BLE001 - what it raised is the answer
            outcome.append(exc)

    try:
        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        asker.join(30)  # 1 s asked; 30 s allows for a loaded machine, 14 minutes does not
        assert not asker.is_alive(), "the runner is still reading the engine's trickle"
    finally:
        engine.close()
        shutil.rmtree(folder, ignore_errors=True)
    (got,) = outcome
    assert isinstance(got, EngineUnavailable), got
    assert isinstance(got.__cause__, TimeoutError), got.__cause__


def test_a_payload_oxum_of_thousands_of_digits_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    """bag-info.txt's Payload-Oxum was turned into ints as its digits came: past Python's
    4,300 digits int() raised ValueError, which the archive scan does not catch, out of
    `runner verify bundle` (a traceback, no report). Now no more than 20 digits a number is
    read, so such a bag declares no Payload-Oxum the runner reads: refused before unpacking."""
    archive = tmp_path / "oxum.bag.tar.gz"
    members = {
        "b/bagit.txt": b"BagIt-Version: 1.0\nTag-File-Character-Encoding: UTF-8\n",
        "b/bag-info.txt": b"Payload-Oxum: " + b"9" * 5000 + b".1\n",
    }
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    report = verify(archive, keys=Keys([], []), allow_untrusted=True)
    assert report.checks[0].name == "archive" and report.checks[0].status == "failed", report
    (first, *_) = report.problems
    assert first.file == "b/bag-info.txt" and "Payload-Oxum" in first.message, first


@pytest.mark.parametrize(
    "encoding",
    ["rot13", "hex", "x-no-such-codec", "UTF-8\nTag-File-Character-Encoding: UTF-8"],
    ids=["rot13", "hex", "unknown", "twice"],
)
def test_a_bagit_txt_naming_a_codec_that_is_no_text_encoding_is_a_problem_not_a_crash(
    tmp_path: Path, encoding: str
) -> None:
    """bagit.txt's Tag-File-Character-Encoding is what bagit.py opens every tag file with: a
    str-to-str codec (rot13) raised TypeError out of `runner verify
    bundle` (a traceback, no report), and so did naming it twice (bagit.py's value is then a
    list). `runner export` writes UTF-8 once, and only that is read now: anything else is a
    bagit.txt problem, before bagit.py opens a tag file."""
    archive = _bag_fetching(tmp_path / "b.bag.tar.gz", "2", encoding=encoding)
    report = verify(archive, keys=Keys([], []), allow_untrusted=True)
    payload = next(c for c in report.checks if c.name == "payload")
    assert payload.status == "failed", payload
    assert any(
        p.file == "bagit.txt" and "UTF-8" in p.message and encoding.split()[0] in p.message
        for p in report.problems
    ), report.problems
