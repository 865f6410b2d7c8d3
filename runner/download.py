"""Downloading one asset's bytes from one source into its ``.partial`` file (see
:mod:`runner.assets` for the cache around it).

HTTP(S) with ``requests``, streamed: resumed with ``Range: bytes=N-`` where the partial file
stops (a 206 must answer the very range asked; a 200 starts over), every redirect's host checked
against the host policy, a 4xx given up at once, a 5xx, a timeout or a broken connection
retried with tenacity (exponential wait). The bytes are hashed as they arrive, never past the
asset's size; a local source beside the contract is read without following a link.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urljoin, urlsplit

from runner import safefs
from runner.contract.models import Asset
from runner.policy import AssetGrant

CHUNK = 1024 * 1024
MAX_REDIRECTS = 5
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0

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

    def write_from(self, chunks: Iterator[bytes], mode: str) -> None:
        with self.partial.open(mode) as out:
            for chunk in chunks:
                if not chunk:
                    continue
                if self.hashed + len(chunk) > self.asset.size:
                    got = self.hashed + len(chunk)
                    self.restart()
                    why = f"the source sends more than {self.asset.size:,} bytes"
                    raise WrongBytes("unknown (cut off)", got, why)
                out.write(chunk)
                self.hasher.update(chunk)
                self.hashed += len(chunk)
                self.received += len(chunk)
                if self.on_bytes is not None:
                    self.on_bytes(self.asset, self.hashed, self.asset.size)

    def finish(self) -> None:
        """Check size and digest; the partial file is removed when they are wrong."""
        self.have()
        digest = "sha256:" + self.hasher.hexdigest()
        if self.hashed != self.asset.size or digest != self.asset.sha256:
            self.restart()
            raise WrongBytes(digest, self.hashed, "")


_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


def http(url: str, d: Download, grant: AssetGrant) -> None:
    import requests

    have = d.have()
    if have == d.asset.size:
        return  # complete already (a runner killed between download and rename)
    headers = {"Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    with requests.Session() as session:
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
            try:
                d.write_from(resp.iter_content(CHUNK), mode)
            except (requests.ConnectionError, requests.Timeout) as exc:
                raise Transient(f"the connection broke: {type(exc).__name__}") from None
            except requests.exceptions.ChunkedEncodingError:
                raise Transient("the connection broke mid-transfer") from None


def _get(session: Any, url: str, headers: dict[str, str], grant: AssetGrant) -> Any:
    """GET ``url``, following redirects by hand so that every hop's host is checked."""
    import requests

    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SourceFailed(f"{redacted(url)} is not an http(s) URL")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if not grant.allows(parts.hostname, port):
            raise SourceFailed(
                f"{parts.hostname}:{port} is not in the host policy's assets.allowHosts"
            )
        try:
            resp = session.get(
                url,
                headers=headers,
                stream=True,
                allow_redirects=False,
                timeout=(CONNECT_TIMEOUT, READ_TIMEOUT),
            )
        except (requests.ConnectionError, requests.Timeout) as exc:
            why = f"cannot reach {parts.hostname}:{port}: {type(exc).__name__}"
            raise Transient(why) from None
        if resp.is_redirect and "Location" in resp.headers:
            url = urljoin(url, resp.headers["Location"])
            resp.close()
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
        reraise=True,
    )
