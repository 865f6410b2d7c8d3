"""Hostile asset sources (issue 16, the assets review): a source on an allowed host that
redirects where parsers disagree, to a URL with credentials or to a port that does not parse,
that says gzip and sends something else, or a broken mirror whose bytes a good one must not
resume on; and an environment (.netrc, proxy variables) that must not reach a source. Each is
refused or falls through to the next source; none is an uncaught error. Loopback servers only
(127.0.0.2 is another loopback host)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.caches.assets import AssetCache, fetch
from runner.contract.models import Asset
from runner.core.errors import AssetDigestMismatch, AssetUnavailable
from runner.planning.policy import AssetGrant
from tests.support.asset_server import AssetServer, Served, asset_server

pytestmark = pytest.mark.hostile

BODY = os.urandom(3 * 1024 * 1024 + 17)


def _asset(*sources: str, body: bytes = BODY) -> Asset:
    return Asset.model_validate(
        {"id": "data", "sources": list(sources), "size": len(body), "path": "blob.bin",
         "sha256": "sha256:" + hashlib.sha256(body).hexdigest()}
    )  # fmt: skip


def _grant(*hosts: str, retries: int = 0) -> AssetGrant:
    return AssetGrant(allowHosts=list(hosts) or ["127.0.0.1"], retries=retries)


@pytest.fixture
def server() -> Iterator[AssetServer]:
    with asset_server() as s:
        yield s


@pytest.fixture
def other_host() -> Iterator[AssetServer]:
    """A server on 127.0.0.2: a host the policies below do not name."""
    with asset_server("127.0.0.2") as s:
        yield s


def test_a_redirect_that_parsers_read_as_two_hosts_is_not_followed(
    tmp_path: Path, server: AssetServer, other_host: AssetServer
) -> None:
    """``http://B\\@A/`` is host A to urlsplit and host B to urllib3 (which connects): the
    allowed source's redirect must not reach B, which would serve the very bytes asked for."""
    evil = f"http://127.0.0.2:{other_host.port}\\@127.0.0.1:{server.port}/x"
    other_host.files[f"%5C@127.0.0.1:{server.port}/x"] = Served(BODY)  # the path B is asked
    server.files["start"] = Served(b"", redirect_to=evil)
    with pytest.raises(AssetUnavailable, match="backslash") as err:
        fetch(_asset(server.url("start")), tmp_path, AssetCache(tmp_path / "c"),
              _grant(f"127.0.0.1:{server.port}"))  # fmt: skip
    assert other_host.log.requests == []
    assert err.value.category == "asset_unavailable"


def test_the_host_checked_is_the_one_urllib3_connects_to(
    tmp_path: Path,
    server: AssetServer,
    other_host: AssetServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second guard alone (the Location filter turned off): the host is read from the URL
    as prepared for sending, so the same redirect is refused naming the host it would reach."""
    import re

    import runner.caches.download

    monkeypatch.setattr(runner.caches.download, "_BAD_LOCATION", re.compile(r"(?!)"))
    evil = f"http://127.0.0.2:{other_host.port}\\@127.0.0.1:{server.port}/x"
    other_host.files[f"%5C@127.0.0.1:{server.port}/x"] = Served(BODY)
    server.files["start"] = Served(b"", redirect_to=evil)
    with pytest.raises(AssetUnavailable, match=rf"127\.0\.0\.2:{other_host.port} is not in"):
        fetch(_asset(server.url("start")), tmp_path, AssetCache(tmp_path / "c"),
              _grant(f"127.0.0.1:{server.port}"))  # fmt: skip
    assert other_host.log.requests == []


def test_a_redirect_to_a_url_with_credentials_is_refused(
    tmp_path: Path, server: AssetServer
) -> None:
    server.files["blob"] = Served(BODY)
    server.files["start"] = Served(
        b"", redirect_to=f"http://alice:s3cret@127.0.0.1:{server.port}/blob"
    )
    with pytest.raises(AssetUnavailable, match=r"carries credentials"):
        fetch(_asset(server.url("start")), tmp_path, AssetCache(tmp_path / "c"), _grant())
    assert server.gets("blob") == 0


def test_no_netrc_login_and_no_proxy_reach_a_source(
    tmp_path: Path, server: AssetServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's environment names a .netrc with a login for the source's host and a proxy
    that does not exist: the source is asked directly, without any Authorization."""
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1\nlogin alice\npassword s3cret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    server.files["blob"] = Served(BODY)
    got = fetch(_asset(server.url("blob")), tmp_path, AssetCache(tmp_path / "c1"), _grant())
    assert got.source == server.url("blob")
    assert server.log.authorization == [None]
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:1")  # nothing listens there
    got = fetch(_asset(server.url("blob")), tmp_path, AssetCache(tmp_path / "c2"), _grant())
    assert got.source == server.url("blob")
    assert server.log.authorization == [None, None]


@pytest.mark.parametrize(
    "served",
    [
        Served(b"not gzip at all!!!!!", headers={"Content-Encoding": "gzip"}),
        Served(b"", redirect_to="http://127.0.0.1:99999/x"),
        Served(b"", redirect_to="http://127.0.0.1:1\tx/"),
        Served(b"", redirect_to="http://[::1/x"),
    ],
    ids=["gzip-that-is-not", "port-99999", "tab-in-location", "unclosed-bracket"],
)
def test_a_hostile_answer_falls_through_to_the_next_source(
    tmp_path: Path, server: AssetServer, served: Served
) -> None:
    """Before: ContentDecodingError, ValueError or InvalidURL escaped the fetch uncaught."""
    server.files["bad"] = served
    server.files["good"] = Served(BODY)
    a = _asset(server.url("bad"), server.url("good"))
    got = fetch(a, tmp_path, AssetCache(tmp_path / "c"), _grant())
    assert got.source == server.url("good")
    with pytest.raises(AssetUnavailable, match=r"could not be fetched: .*/bad"):
        fetch(_asset(server.url("bad")), tmp_path, AssetCache(tmp_path / "c2"), _grant())


def test_a_broken_first_mirror_does_not_spoil_a_good_second(
    tmp_path: Path, server: AssetServer
) -> None:
    """Mirror 1 sends 1.5 MiB of wrong bytes and breaks; mirror 2 must start from zero, not
    resume (Range) on top of them and blame the contract with a digest mismatch."""
    server.files["broken"] = Served(os.urandom(len(BODY)), cut_after=1536 * 1024)
    server.files["good"] = Served(BODY)
    cache = AssetCache(tmp_path / "c")
    got = fetch(_asset(server.url("broken"), server.url("good")), tmp_path, cache, _grant())
    assert got.source == server.url("good")
    assert ("good", None) in server.log.requests  # asked from the start
    assert cache.blob(hashlib.sha256(BODY).hexdigest()).read_bytes() == BODY
    assert list((cache.root / "partial").iterdir()) == []


def test_a_partial_file_of_unknown_origin_is_not_resumed(
    tmp_path: Path, server: AssetServer
) -> None:
    """A partial file no source is recorded for (another runner's, another mirror's) is
    started over rather than resumed with a Range."""
    cache = AssetCache(tmp_path / "c")
    cache.prepare()
    cache.partial(hashlib.sha256(BODY).hexdigest()).write_bytes(b"\xff" * (1024 * 1024))
    server.files["blob"] = Served(BODY)
    got = fetch(_asset(server.url("blob")), tmp_path, cache, _grant())
    assert got.downloaded == len(BODY)
    assert server.log.requests == [("blob", None)]


def test_a_digest_mismatch_names_the_size_received(tmp_path: Path, server: AssetServer) -> None:
    """It said "(0 bytes)": the size was read after the partial file was removed."""
    server.files["blob"] = Served(b"w" * 1000)
    with pytest.raises(AssetDigestMismatch) as err:
        fetch(_asset(server.url("blob")), tmp_path, AssetCache(tmp_path / "c"), _grant())
    got = "sha256:" + hashlib.sha256(b"w" * 1000).hexdigest()
    assert f"got {got} (1,000 bytes)" in str(err.value)


def test_a_source_that_trickles_is_cut_off_and_a_steady_one_is_not(
    tmp_path: Path, server: AssetServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A byte every 59 s never trips a 60 s read timeout, and held the digest's lock (and every
    runner waiting on it) for ever. With the minimum rate scaled down (10,000 bytes a second
    over 0.5 s windows): a source sending 200 bytes a second is cut off within a window or
    two, naming the rate; one sending about 640 KiB a second is not."""
    import time

    import runner.caches.download

    monkeypatch.setattr(runner.caches.download, "MIN_RATE", 10_000, raising=False)
    monkeypatch.setattr(runner.caches.download, "RATE_WINDOW", 0.5, raising=False)
    slow = os.urandom(2000)
    server.files["slow"] = Served(slow, chunk=100, delay_per_chunk=0.5)  # 10 s in all
    since = time.monotonic()
    with pytest.raises(AssetUnavailable, match="cut off as too slow"):
        fetch(_asset(server.url("slow"), body=slow), tmp_path, AssetCache(tmp_path / "c"),
              _grant())  # fmt: skip
    assert time.monotonic() - since < 5
    steady = os.urandom(1024 * 1024)
    server.files["steady"] = Served(steady, chunk=64 * 1024, delay_per_chunk=0.1)
    got = fetch(_asset(server.url("steady"), body=steady), tmp_path, AssetCache(tmp_path / "c"),
                _grant())  # fmt: skip
    assert got.downloaded == len(steady)
