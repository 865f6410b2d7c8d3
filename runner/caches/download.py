"""Downloading one asset's bytes from one source into its ``.partial`` file (see
:mod:`runner.caches.assets` for the cache around it).

HTTP(S) with ``requests``, streamed: resumed with ``Range: bytes=N-`` where the partial file
stops (a 206 must answer the very range asked; a 200 starts over), a 4xx given up at once, a
5xx, a timeout or a broken connection retried with tenacity (exponential wait). The bytes are
read as each receive gives them (up to 1 MiB a read), written, and hashed as they arrive on a
thread beside the writing, never past the asset's size; their writeback to disk is started every
32 MiB, so the one fsync before the rename waits for little. Nothing is read twice: the digest
is ready with the last byte. A local source beside the contract is read without following a
link.

Every request's host -- the first URL's and every redirect's -- is checked against the host
policy on the URL as ``requests`` prepared it, parsed by urllib3 (which is what connects), not
by another parser that may read a hostile ``Location`` otherwise. The session ignores the
environment (no ``.netrc`` login, no proxy variables): a source gets no ambient credentials.
A partial file is resumed only from the source that began it (``<hex>.partial.source`` holds
that source's SHA-256), never on top of another mirror's bytes. A body that arrives slower
than ``MIN_RATE`` (over each ``RATE_WINDOW``) is cut off, and so is a response head (status line
and headers) that has not arrived ``HEAD_TIMEOUT`` seconds after its request began, so a
trickling source cannot hold the digest's lock for ever: ``requests``' read timeout is per
read, and a byte every 59 s defeats it. Each request is bounded in all: its head by
``HEAD_TIMEOUT`` (connecting included, each redirect a request of its own), its body by the
rate rule (at most ``RATE_WINDOW`` seconds per ``MIN_RATE * RATE_WINDOW`` bytes of the asset's
size, and one window more).
"""

from __future__ import annotations

import functools
import hashlib
import os
import queue
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urljoin, urlsplit

from runner.contract.models import Asset
from runner.core import clock, deadlines, safefs
from runner.planning.policy import AssetGrant

__all__ = [
    "Download",
    "OnBytes",
    "SourceFailed",
    "Transient",
    "WrongBytes",
    "http",
    "local",
    "redacted",
    "retrying",
]

CHUNK = 1024 * 1024
MAX_REDIRECTS = 5
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
HEAD_TIMEOUT = 60.0
"""Seconds from a request's start (its connection included) to the end of its response head:
past it the connection is shut down (a thread; shutting the socket down wakes the read)."""
MIN_RATE = 16 * 1024
"""Bytes a second a source must keep up, on average over each ``RATE_WINDOW``: a source that
trickles (a byte every 59 s defeats the read timeout) is cut off rather than hold the digest's
lock -- and every runner waiting on it -- for ever."""
RATE_WINDOW = 120.0
READ_CHUNK = 1024 * 1024
"""The most bytes one read takes from a response: a read takes what one receive gives (urllib3's
``read1``), up to this, so the rate rule sees the bytes as they arrive however slowly they come,
and a fast source is read in large pieces."""
CHUNKED_READ = 64 * 1024
"""Bytes read at a time from a response in chunked transfer coding (``read1`` cannot decode it:
``iter_content`` reads it, each read waiting for this many bytes)."""
HASH_QUEUE = 8
"""Chunks written but not yet hashed, at most (each at most ``READ_CHUNK``)."""
WRITEBACK_BYTES = 32 * 1024 * 1024
"""Every this many bytes written, their writeback to disk is started (``sync_file_range``, no
wait): the one fsync before the rename then waits for the last few only."""

OnBytes = Callable[[Asset, int, int], None]
"""Progress: called with the asset, the bytes it has so far and its size."""


def redacted(url: str) -> str:
    """A source without its query string (which may carry a token) for records and messages."""
    return url.split("?", 1)[0]


class Transient(Exception):
    """A failure worth retrying the same source for (5xx, timeout, a broken connection)."""


class SourceFailed(Exception):
    """This source will not do (4xx, a host the policy does not allow, a missing file)."""


class WrongBytes(Exception):
    def __init__(self, digest: str, size: int, why: str) -> None:
        super().__init__(why)
        self.digest, self.size, self.why = digest, size, why


class Download:
    """One source's bytes into the partial file, resumed where it stopped, hashed as they come.
    The hash covers the partial file's bytes so far: rebuilt from the file when the hasher
    does not match its length (a resume after a killed runner)."""

    def __init__(self, asset: Asset, partial: Path, on_bytes: OnBytes | None) -> None:
        self.asset = asset
        self.partial = partial
        self.on_bytes = on_bytes
        self.hasher = hashlib.sha256()
        self.hashed = 0
        self.received = 0

    def have(self) -> int:
        try:
            size = os.lstat(self.partial).st_size
        except FileNotFoundError:
            return 0
        if size > self.asset.size:
            self.restart()
            return 0
        if size != self.hashed:
            self.hasher, self.hashed = hashlib.sha256(), 0
            with self.partial.open("rb") as f:
                while chunk := f.read(CHUNK):
                    self.hasher.update(chunk)
                    self.hashed += len(chunk)
        return size

    def restart(self) -> None:
        self.partial.unlink(missing_ok=True)
        self.hasher, self.hashed = hashlib.sha256(), 0

    @property
    def sidecar(self) -> Path:
        """Names the source the partial file's bytes came from (its SHA-256: no token kept)."""
        return self.partial.with_name(self.partial.name + ".source")

    def begin(self, source: str) -> None:
        """Bytes from ``source`` follow: keep the partial file only when that source began it
        (a resume), else start over -- never resume on top of another mirror's bytes."""
        mark = hashlib.sha256(source.encode()).hexdigest()
        try:
            before = self.sidecar.read_text(encoding="ascii", errors="replace")
        except OSError:
            before = ""
        if before != mark:
            self.restart()
            atomic = self.sidecar.with_name(self.sidecar.name + ".tmp")
            atomic.write_text(mark, encoding="ascii")
            os.replace(atomic, self.sidecar)

    def done(self) -> None:
        """The partial file is gone (renamed into place or refused): forget its source."""
        self.sidecar.unlink(missing_ok=True)

    def write_from(self, chunks: Iterator[bytes], mode: str) -> None:
        """Write ``chunks`` to the partial file, hashing them on a thread beside the writing
        (hashlib lets go of the GIL): the digest is ready when the last byte is written."""
        with self.partial.open(mode) as out, _Hashing(self.hasher) as hashing:
            unflushed = 0
            for chunk in chunks:
                if not chunk:
                    continue
                if self.hashed + len(chunk) > self.asset.size:
                    got = self.hashed + len(chunk)
                    self.restart()
                    why = f"the source sends more than {self.asset.size:,} bytes"
                    raise WrongBytes("unknown (cut off)", got, why)
                out.write(chunk)
                hashing.put(chunk)
                unflushed += len(chunk)
                if unflushed >= WRITEBACK_BYTES:
                    out.flush()  # the file's end: after a resume ("ab") past the old bytes
                    _start_writeback(out.fileno(), out.tell() - unflushed, unflushed)
                    unflushed = 0
                self.hashed += len(chunk)
                self.received += len(chunk)
                if self.on_bytes is not None:
                    self.on_bytes(self.asset, self.hashed, self.asset.size)

    def finish(self) -> None:
        """Check size and digest; the partial file is removed when they are wrong."""
        self.have()
        digest, size = "sha256:" + self.hasher.hexdigest(), self.hashed
        if size != self.asset.size or digest != self.asset.sha256:
            self.restart()
            raise WrongBytes(digest, size, "")


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range(2)`` (Linux; Python has no binding), or None."""
    import ctypes

    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


_SYNC_FILE_RANGE_WRITE = 2


def _start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Start writing ``nbytes`` of ``fd`` at ``offset`` to disk, not waiting for it. A hint,
    its failure ignored: what it does not write, the fsync before the rename does."""
    call = _sync_file_range()
    if call is not None:
        call(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


class _Hashing:
    """Feeds a hasher on a thread of its own, at most ``HASH_QUEUE`` chunks behind; every chunk
    put is hashed when the ``with`` ends (however it ends)."""

    def __init__(self, hasher: Any) -> None:
        self.hasher = hasher
        self.queue: queue.Queue[bytes | None] = queue.Queue(maxsize=HASH_QUEUE)
        self.thread = threading.Thread(target=self._run, name="asset-hash", daemon=True)

    def __enter__(self) -> _Hashing:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.queue.put(None)
        self.thread.join()

    def put(self, chunk: bytes) -> None:
        self.queue.put(chunk)

    def _run(self) -> None:
        while (chunk := self.queue.get()) is not None:
            self.hasher.update(chunk)


_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


def http(url: str, d: Download, grant: AssetGrant) -> None:
    """One try of ``url`` into ``d``. Raises :class:`Transient` (worth another try),
    :class:`SourceFailed` (not this source) or :class:`WrongBytes`; whatever else ``requests``
    raises on what a hostile server sends is one of those, never an uncaught error."""
    import requests

    try:
        _http(url, d, grant)
    except (Transient, SourceFailed, WrongBytes):
        raise
    except (requests.ConnectionError, requests.Timeout) as exc:
        raise Transient(f"the connection broke: {type(exc).__name__}") from None
    except requests.exceptions.ChunkedEncodingError:
        raise Transient("the connection broke mid-transfer") from None
    except (requests.RequestException, ValueError) as exc:
        # a body that does not decode as its Content-Encoding says, a URL that does not parse
        raise SourceFailed(f"{redacted(url)}: {type(exc).__name__}: {_short(exc)}") from None


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:197] + "..."


def _http(url: str, d: Download, grant: AssetGrant) -> None:
    import requests

    have = d.have()
    if have == d.asset.size:
        return  # complete already (a runner killed between download and rename)
    headers = {"Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    with requests.Session() as session:
        session.trust_env = False  # no .netrc login, no proxy from the environment
        adapter = _adapter()
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        resp = _get(session, url, headers, grant)
        with resp:
            code = resp.status_code
            if code == 416:
                d.restart()
                raise Transient("the source refused the range asked for; starting over")
            if 400 <= code < 500:
                raise SourceFailed(f"{redacted(url)} answered {code} {resp.reason}")
            if code >= 500:
                raise Transient(f"{redacted(url)} answered {code} {resp.reason}")
            if code == 206 and have:
                match = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
                if match is None or int(match.group(1)) != have:
                    d.restart()
                    raise Transient("the source answered another range than asked; starting over")
                mode = "ab"
            elif code == 200:
                d.restart()  # the source ignores ranges: from the start
                mode = "wb"
            else:
                raise SourceFailed(f"{redacted(url)} answered {code} {resp.reason}")
            dog = deadlines.RateWatch(resp, lambda: d.received, RATE_WINDOW, MIN_RATE)
            with dog:
                try:
                    d.write_from(_body(resp), mode)
                except requests.RequestException:
                    if dog.expired:
                        raise SourceFailed(dog.too_slow(redacted(url))) from None
                    raise
                if dog.expired:  # cut off between two reads
                    raise SourceFailed(dog.too_slow(redacted(url)))


def _body(resp: Any) -> Iterator[bytes]:
    """The response's body as it arrives (decoded as its Content-Encoding says), what each
    receive gives; urllib3's errors raised as ``requests``' own, as ``iter_content`` does."""
    import requests
    import urllib3.exceptions as u

    raw = resp.raw
    if raw.chunked:
        yield from resp.iter_content(CHUNKED_READ)
        return
    try:
        while chunk := raw.read1(READ_CHUNK, decode_content=True):
            yield chunk
    except u.ProtocolError as exc:
        raise requests.exceptions.ChunkedEncodingError(exc) from None
    except u.DecodeError as exc:
        raise requests.exceptions.ContentDecodingError(exc) from None
    except u.ReadTimeoutError as exc:
        raise requests.exceptions.ConnectionError(exc) from None
    except u.SSLError as exc:
        raise requests.exceptions.SSLError(exc) from None


def _adapter() -> Any:
    return deadlines.adapter_class()()


_BAD_LOCATION = re.compile(r"[\\\s\x00-\x1f\x7f]")
"""A backslash, whitespace or a control character: parsers disagree on what such a URL names."""


def _checked(url: str, grant: AssetGrant) -> tuple[str, int]:
    """The host and port ``url`` (as prepared) connects to, when the policy allows them."""
    from urllib3.util import parse_url

    parsed = parse_url(url)  # what urllib3 connects to; raises a ValueError when it cannot
    other = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise SourceFailed(f"{redacted(url)} is not an http(s) URL")
    if parsed.auth or other.username is not None or other.password is not None:
        raise SourceFailed(f"{redacted(url)} carries credentials (user@host); refused")
    host = parsed.host.strip("[]")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    if (other.hostname or "") != host.lower() or (other.port or port) != port:
        raise SourceFailed(f"{redacted(url)} reads as another host to another parser; refused")
    if not grant.allows(host, port):
        raise SourceFailed(f"{host}:{port} is not in the host policy's assets.allowHosts")
    return host, port


def _get(session: Any, url: str, headers: dict[str, str], grant: AssetGrant) -> Any:
    """GET ``url``, following redirects by hand so that every hop's host is checked, on the
    URL as prepared for sending (the one fetched)."""
    import requests

    for _ in range(MAX_REDIRECTS + 1):
        if _BAD_LOCATION.search(url):
            raise SourceFailed(
                f"{redacted(url)!r} holds a backslash, whitespace or a control character"
            )
        prepared = session.prepare_request(requests.Request("GET", url, headers=headers))
        host, port = _checked(prepared.url, grant)
        head = deadlines.HeadDeadline(HEAD_TIMEOUT)
        try:
            with head:
                resp = session.send(
                    prepared,
                    stream=True,
                    allow_redirects=False,
                    timeout=(CONNECT_TIMEOUT, READ_TIMEOUT),
                )
        except requests.RequestException as exc:
            if head.expired:
                raise SourceFailed(head.too_slow(redacted(prepared.url))) from None
            if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
                raise Transient(f"cannot reach {host}:{port}: {type(exc).__name__}") from None
            raise
        if head.expired:  # the head came, but too late
            resp.close()
            raise SourceFailed(head.too_slow(redacted(prepared.url)))
        if resp.is_redirect and "Location" in resp.headers:
            location = resp.headers["Location"]
            resp.close()
            if _BAD_LOCATION.search(location):
                raise SourceFailed(
                    f"{redacted(url)} redirects to {redacted(location)!r}, which holds a "
                    "backslash, whitespace or a control character; refused"
                )
            url = urljoin(prepared.url, location)
            continue
        return resp
    raise SourceFailed(f"more than {MAX_REDIRECTS} redirects")


def local(base_dir: Path, rel: str, d: Download) -> None:
    """A source beside the contract: a regular file, no link followed on the way."""
    try:
        src: BinaryIO = safefs.open_under(base_dir, rel)
    except safefs.UnsafePath as exc:
        raise SourceFailed(f"{rel} {exc.problem}") from None
    with src:
        d.restart()

        def chunks() -> Iterator[bytes]:
            while chunk := src.read(CHUNK):
                yield chunk

        d.write_from(chunks(), "wb")


def retrying(grant: AssetGrant) -> Any:
    import tenacity

    return tenacity.Retrying(
        stop=tenacity.stop_after_attempt(grant.retries + 1),
        wait=tenacity.wait_exponential(multiplier=0.25, max=8),
        retry=tenacity.retry_if_exception_type(Transient),
        sleep=clock.sleep,
        reraise=True,
    )
