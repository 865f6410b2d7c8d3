"""Hostile sources and bundles, and the distribution's own Python (issue 25, items 6, 7, 14):
a source that trickles its response head, a bundle whose member is a bomb (against its own
Payload-Oxum, the free space, or as a pax header), and the README's commands run by a venv
made with /usr/bin/python3 (Debian 12's 3.11.2, older than the ``filter=`` argument of
tarfile's extract). Loopback servers and test folders only.

The tests that need the engine are in tests/integration/test_hostile_fetch_bundle.py."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import socket
import tarfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from runner.caches.assets import AssetCache, fetch
from runner.contract.models import Asset
from runner.core import archives
from runner.core.errors import AssetUnavailable
from runner.planning.policy import AssetGrant
from tests.support import run_cli
from tests.support.asset_server import Served, asset_server

pytestmark = pytest.mark.hostile

MiB = 1024 * 1024

# -- item 6: a response head that trickles ------------------------------------------------


@contextmanager
def _trickling_head(per_byte: float, for_at_most: float) -> Iterator[tuple[str, threading.Event]]:
    """A stdlib socket server that answers every request with a response head sent one byte
    every ``per_byte`` seconds (never a read timeout), for at most ``for_at_most`` seconds;
    its URL and an event set once a request has come in."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.1)
    stop = threading.Event()
    asked = threading.Event()
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nX-Pad: " + b"a" * 100_000 + b"\r\n\r\nx"

    def trickle(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            asked.set()
            until = time.monotonic() + for_at_most
            for byte in head:
                if stop.is_set() or time.monotonic() > until:
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return  # the client cut it off
                time.sleep(per_byte)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}/slow-head", asked
    finally:
        stop.set()
        thread.join()
        srv.close()


def test_a_response_head_that_trickles_is_cut_off_and_frees_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head sent a byte every 0.2 s never trips the 60 s read timeout, and held the fetch
    (and the digest's lock) for as long as the server kept going. With the head's deadline
    scaled down to 1.5 s, the fetch fails within a few seconds naming the source and the
    head, and a second fetch of the same digest from a good source, waiting at most 20 s
    for the lock, gets it while the first server is still trickling."""
    import runner.caches.download

    monkeypatch.setattr(runner.caches.download, "HEAD_TIMEOUT", 1.5, raising=False)
    body = os.urandom(256 * 1024)
    digest = "sha256:" + hashlib.sha256(body).hexdigest()

    def asset(source: str) -> Asset:
        return Asset.model_validate(
            {"id": "data", "sources": [source], "size": len(body), "path": "blob.bin",
             "sha256": digest}
        )  # fmt: skip

    grant = AssetGrant(allowHosts=["127.0.0.1"], retries=0)
    cache = AssetCache(tmp_path / "cache")
    failed: list[BaseException] = []
    took: list[float] = []
    with _trickling_head(per_byte=0.2, for_at_most=60) as (slow_url, asked):

        def first() -> None:
            since = time.monotonic()
            try:
                fetch(asset(slow_url), tmp_path, cache, grant)
            except BaseException as exc:  # noqa: BLE001 - kept for the assertions below
                failed.append(exc)
            took.append(time.monotonic() - since)

        thread = threading.Thread(target=first, daemon=True)
        thread.start()
        assert asked.wait(20), "the first fetch never reached the trickling server"
        with asset_server() as good:
            good.files["good"] = Served(body)
            got = fetch(asset(good.url("good")), tmp_path, cache, grant, lock_timeout=20)
        assert got.downloaded == len(body)
        thread.join(30)
        assert not thread.is_alive()
    assert took and took[0] < 15, took
    (exc,) = failed
    assert isinstance(exc, AssetUnavailable), repr(exc)
    assert slow_url in exc.message and "response head" in exc.message, exc.message
    assert "within 1.5 s" in exc.message and "too slow" in exc.message, exc.message


def test_a_trickling_head_after_a_redirect_on_a_kept_alive_connection_is_cut_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The redirect's target on the same host is asked on the same (kept-alive) connection,
    for which no new socket is made: its head has the deadline too."""
    import runner.caches.download

    monkeypatch.setattr(runner.caches.download, "HEAD_TIMEOUT", 1.0, raising=False)
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    second: list[bytes] = []

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: /two\r\nContent-Length: 0\r\n\r\n")
            conn.settimeout(10)
            second.append(conn.recv(65536))
            for byte in b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 300:
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    body = b"x"
    asset = Asset.model_validate(
        {"id": "data", "sources": [f"http://127.0.0.1:{port}/one"], "size": 1, "path": "b",
         "sha256": "sha256:" + hashlib.sha256(body).hexdigest()}
    )  # fmt: skip
    since = time.monotonic()
    try:
        with pytest.raises(AssetUnavailable, match="response head") as err:
            fetch(asset, tmp_path, AssetCache(tmp_path / "c"),
                  AssetGrant(allowHosts=["127.0.0.1"], retries=0))  # fmt: skip
    finally:
        thread.join(40)
        srv.close()
    assert time.monotonic() - since < 15
    assert second and second[0].startswith(b"GET /two "), second  # the same connection
    assert f"127.0.0.1:{port}/two" in err.value.message


def test_a_tls_handshake_that_trickles_is_cut_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An https:// source whose server sends its TLS handshake a byte every 0.1 s: the socket
    is handed to the deadline before the handshake, so the head's deadline covers it too
    (before, only Python's own total for a handshake, the 10 s connect timeout, ended it,
    as a connection failure worth retrying)."""
    import runner.caches.download

    monkeypatch.setattr(runner.caches.download, "HEAD_TIMEOUT", 1.0, raising=False)
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        conn, _ = srv.accept()
        # A TLS handshake record's header (22, TLS 1.2, 200 bytes), then its body a byte at a
        # time: the client waits for the whole record, and never a read timeout.
        record = b"\x16\x03\x03\x00\xc8" + b"\x00" * 200
        with conn:
            for byte in record:
                if stop.is_set():
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    url = f"https://127.0.0.1:{port}/x"
    asset = Asset.model_validate(
        {"id": "data", "sources": [url], "size": 1, "path": "b",
         "sha256": "sha256:" + hashlib.sha256(b"x").hexdigest()}
    )  # fmt: skip
    since = time.monotonic()
    try:
        with pytest.raises(AssetUnavailable, match="response head") as err:
            fetch(asset, tmp_path, AssetCache(tmp_path / "c"),
                  AssetGrant(allowHosts=["127.0.0.1"], retries=0))  # fmt: skip
    finally:
        stop.set()
        thread.join(10)
        srv.close()
    assert time.monotonic() - since < 15
    assert url in err.value.message


# -- item 7: bombs in a bundle --------------------------------------------------------------

ZEROS_1MIB = gzip.compress(b"\0" * MiB, compresslevel=9)
"""One gzip member of 1 MiB of zeros (about 1 KiB): a gzip file may be many members, so N of
them are N MiB of zeros for N KiB of archive."""


def _member(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info.tobuf(format=tarfile.PAX_FORMAT) + data + b"\0" * (-len(data) % 512)


def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(format=tarfile.PAX_FORMAT)


def _bag_member(oxum: str) -> bytes:
    return _member("b/bag-info.txt", f"Payload-Oxum: {oxum}\nBagging-Date: 2026-12-01\n".encode())


BAGIT = _member("b/bagit.txt", b"BagIt-Version: 1.0\nTag-File-Character-Encoding: UTF-8\n")
RESULT = _member("b/data/result.json", b"{}")
END = b"\0" * 1024


def _bomb_bundle(path: Path, zeros_mib: int, *, bag_info_first: bool) -> Path:
    """A .tar.gz bag whose data/zeros.bin holds ``zeros_mib`` MiB of zeros (the archive is
    about a KiB a MiB), while bag-info.txt's Payload-Oxum says the payload is 2 bytes in one
    file; bag-info.txt before the bomb (as `runner export` orders a bag) or after it."""
    bag_info = _bag_member("2.1")
    head = (
        BAGIT + (bag_info if bag_info_first else b"") + _header("b/data/zeros.bin", zeros_mib * MiB)
    )
    tail = RESULT + (b"" if bag_info_first else bag_info) + END
    with path.open("wb") as out:
        out.write(gzip.compress(head))
        for _ in range(zeros_mib):
            out.write(ZEROS_1MIB)
        out.write(gzip.compress(tail))
    return path


def _tree_bytes(root: Path) -> int:
    total = 0
    for folder, _dirs, files in os.walk(root):
        for f in files:
            with suppress(FileNotFoundError):
                total += os.lstat(os.path.join(folder, f)).st_blocks * 512
    return total


def _verify_watched(
    archive: Path, tmp: Path, *extra: str
) -> tuple[int, dict[str, Any], int, float]:
    """`runner verify-bundle --json --allow-untrusted` with TMPDIR at ``tmp``, the size of
    ``tmp`` sampled every few milliseconds meanwhile: (exit code, report, peak bytes on disk
    under ``tmp``, seconds)."""
    tmp.mkdir()
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_bytes(tmp))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    since = time.monotonic()
    try:
        proc = run_cli(
            "verify-bundle", str(archive), "--json", "--allow-untrusted", *extra,
            env={"TMPDIR": str(tmp)}, timeout=240,
        )  # fmt: skip
    finally:
        took = time.monotonic() - since
        done.set()
        watcher.join()
    peak[0] = max(peak[0], _tree_bytes(tmp))
    assert "Traceback" not in proc.stderr, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    assert not list(tmp.iterdir()), "verify-bundle left its temporary folder behind"
    return proc.returncode, report, peak[0], took


def check_bomb_refused(folder: Path, zeros_mib: int, *, bag_info_first: bool) -> None:
    """``zeros_mib`` MiB of zeros in a .tar.gz of about as many KiB, against a Payload-Oxum of
    2 bytes: refused, naming the Payload-Oxum, with nothing of it written to TMPDIR (it wrote
    the whole member out before). With bag-info.txt first (as `runner export` writes a bag)
    it is refused at the bomb's header, before any of its data is even decompressed; with
    bag-info.txt last, once the (unwritten) stream is read through."""
    archive = _bomb_bundle(folder / "bomb.bag.tar.gz", zeros_mib, bag_info_first=bag_info_first)
    assert archive.stat().st_size < 4 * MiB
    code, report, peak, took = _verify_watched(archive, folder / "tmp")
    assert code == 3 and report["category"] == "bundle_invalid", report
    first = report["firstProblem"]
    assert first["file"] == ("b/data/zeros.bin" if bag_info_first else "b/bag-info.txt"), first
    assert "Payload-Oxum" in first["message"] and "before anything is unpacked" in first["message"]
    assert peak < MiB, f"{peak:,} bytes were written to TMPDIR"
    assert took < (30 if bag_info_first else 120), took


@pytest.mark.parametrize(
    ("bag_info_first", "zeros_mib"),
    [(True, 1024), (False, 128)],
    ids=["bag-info-first", "bag-info-last"],
)
def test_a_bomb_member_is_refused_before_anything_is_written(
    tmp_path: Path, bag_info_first: bool, zeros_mib: int
) -> None:
    """A bomb against its Payload-Oxum. With bag-info.txt first, 1 GiB of zeros: refused at
    the header, so its size costs nothing. With bag-info.txt last the check reads the whole
    stream through, and decompressing 1 GiB costs about 3 s (zlib itself; gzip's seek is
    as fast as a read), so 128 MiB here: writing that out would take well over 100 ms, which
    the 5 ms sampling of TMPDIR cannot miss. The 1 GiB case is in
    tests/integration/test_hostile_fetch_bundle.py (slow)."""
    check_bomb_refused(tmp_path, zeros_mib, bag_info_first=bag_info_first)


def test_a_bundle_larger_than_the_free_space_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """A member declaring 1 PiB (a pax size), with a Payload-Oxum and --max-total-mb that
    allow it: refused at its header for the temporary folder's free space, naming TMPDIR."""
    huge = 1 << 50
    archive = tmp_path / "huge.bag.tar"
    archive.write_bytes(
        BAGIT + _bag_member(f"{huge}.1") + _header("b/data/huge.bin", huge) + b"\0" * 4096
    )
    code, report, peak, _ = _verify_watched(
        archive, tmp_path / "tmp", "--max-total-mb", str(4 * huge // MiB)
    )
    assert code == 3 and report["category"] == "bundle_invalid", report
    first = report["firstProblem"]
    assert first["file"] == "b/data/huge.bin" and "bytes free" in first["message"], first
    assert "TMPDIR" in first["message"] and str(tmp_path / "tmp") in first["message"], first
    assert peak < MiB


def _pax_bomb(path: Path, zeros_mib: int) -> Path:
    """A .tar.gz whose first header is a pax header of ``zeros_mib`` MiB of zeros: tarfile
    reads a pax header's data into memory at once."""
    with path.open("wb") as out:
        out.write(
            gzip.compress(BAGIT + _header("b/././@PaxHeader", zeros_mib * MiB, tarfile.XHDTYPE))
        )
        for _ in range(zeros_mib):
            out.write(ZEROS_1MIB)
        out.write(gzip.compress(END))
    return path


def test_a_pax_header_bomb_is_refused_without_reading_it(tmp_path: Path) -> None:
    """A 512 MiB pax header (in a 0.5 MiB archive) was read into memory whole; both readers
    of archives (verify-bundle, and an asset's unpack) refuse it at its header."""
    archive = _pax_bomb(tmp_path / "pax.bag.tar.gz", 512)
    code, report, peak, took = _verify_watched(archive, tmp_path / "tmp")
    assert code == 3 and report["category"] == "bundle_invalid", report
    assert "header of more than" in report["firstProblem"]["message"], report["firstProblem"]
    assert peak < MiB and took < 30
    with pytest.raises(archives.UnsafeArchive, match="header of more than"):
        archives.unpack(archive, "tar", tmp_path / "tree", max_bytes=1 << 40, max_files=100)
    assert not (tmp_path / "tree").exists()


def test_a_bag_without_payload_oxum_is_refused_before_unpacking(tmp_path: Path) -> None:
    archive = tmp_path / "no-oxum.bag.tar"
    archive.write_bytes(
        BAGIT + _member("b/bag-info.txt", b"Bagging-Date: 2026-12-01\n") + RESULT + END
    )
    code, report, peak, _ = _verify_watched(archive, tmp_path / "tmp")
    assert code == 3 and report["firstProblem"]["file"] == "b/bag-info.txt", report
    assert "declares no Payload-Oxum" in report["firstProblem"]["message"]
    assert peak < MiB
