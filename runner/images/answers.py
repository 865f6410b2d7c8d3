"""A registry's answers: each request of an image check made and read within a deadline, at
most :data:`BODY_MAX` bytes of it, redirects followed one by one; and what the registry says,
quoted safely. The check itself (which requests, what a status means) is
:mod:`runner.images.registry`'s."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
import urllib3.exceptions

from runner.backends.types import engine_text
from runner.core import deadlines, jsondepth, untrusted
from runner.core.redaction import Redactor

__all__ = [
    "BODY_MAX",
    "LEFT_OUT",
    "REDIRECTS",
    "TOKEN",
    "Answer",
    "ask",
    "json_object",
    "keeps_credentials",
    "message",
    "quotes_credentials",
    "session",
]

BODY_MAX = 64 * 1024
"""The most of a registry's answer read (a token, an error): a larger one is not read on."""


@dataclass(frozen=True)
class Answer:
    """A registry's answer: its status, its reason phrase (as sent: :func:`message` makes it
    printable) and at most :data:`BODY_MAX` bytes of its body."""

    status: int
    reason: str
    body: bytes
    challenge: str
    """Its ``WWW-Authenticate`` header (a header line is at most 64 KiB: ``http.client``)."""
    url: str = ""
    """Where it came from: the URL asked, or the last a redirect led to (a challenge from
    another host than the one asked is not that host's to make: :func:`keeps_credentials`)."""


REDIRECTS = 5
"""The most redirects a request to a registry follows (as the engine's own client does for a
manifest, a HEAD's included)."""
_REDIRECT = frozenset({301, 302, 303, 307, 308})


def ask(http: requests.Session, method: str, url: str, timeout: float, **kw: Any) -> Answer:
    """One request and what :class:`Answer` keeps of its answer, each hop within ``timeout``
    seconds: past it the connection is shut down (:class:`runner.core.deadlines.HeadDeadline`,
    here held until the body is read too), as the timeout alone bounds each receive only (a
    registry trickling its answer a byte at a time held ``runner pin`` for ever). It follows
    up to :data:`REDIRECTS` redirects here (a HEAD stays a HEAD), each read as any answer
    (``requests`` reads a redirect's whole body, decompressed), credentials kept for the same
    host only.
    Whatever goes wrong (no answer, one cut short, a malformed one, a bad redirect) is a
    ``requests.ConnectionError`` or ``requests.Timeout``: the registry did not answer."""
    headers = {**kw.pop("headers", {}), "Accept-Encoding": "identity"}
    try:
        for _ in range(REDIRECTS + 1):
            with deadlines.HeadDeadline(timeout) as deadline:
                resp = http.request(
                    method, url, headers=headers, timeout=timeout, stream=True,
                    allow_redirects=False, **kw,
                )  # fmt: skip
                try:
                    head = method == "HEAD" or resp.status_code in _REDIRECT
                    body = b"" if head else resp.raw.read(BODY_MAX, decode_content=False)
                finally:
                    resp.close()
            if deadline.expired:  # the connection was shut down: what was read is cut short
                raise requests.Timeout(f"no whole answer within {timeout:g} s")
            location = resp.headers.get("Location")
            if resp.status_code not in _REDIRECT or not location:
                challenge = resp.headers.get("WWW-Authenticate", "")
                return Answer(resp.status_code, str(resp.reason or ""), body, challenge, url)
            target = urljoin(url, location)
            if urlsplit(target).scheme not in ("http", "https"):
                raise requests.ConnectionError(f"redirected to {engine_text(target)}")
            if not keeps_credentials(url, target):
                headers.pop("Authorization", None)
                kw.pop("auth", None)
            if (resp.status_code == 303 and method != "HEAD") or (
                resp.status_code in (301, 302) and method == "POST"
            ):
                method = "GET"
                kw.pop("data", None)
            kw.pop("params", None)  # the redirect's own query string says what it wants
            url = target
    except (requests.RequestException, urllib3.exceptions.HTTPError, ValueError) as exc:
        if isinstance(exc, requests.ConnectionError | requests.Timeout):
            raise
        raise requests.ConnectionError(f"a malformed answer ({type(exc).__name__})") from None
    raise requests.ConnectionError(f"over {REDIRECTS} redirects")


def keeps_credentials(url: str, target: str) -> bool:
    """Whether a redirect from ``url`` to ``target`` may carry the credentials: to the same
    host and port only, and never from https to plain http (as ``requests`` decides)."""
    now, then = urlsplit(url), urlsplit(target)
    same = then.netloc == now.netloc
    return same and (then.scheme == now.scheme or (now.scheme, then.scheme) == ("http", "https"))


def session() -> requests.Session:
    """A session whose connections a :class:`runner.core.deadlines.HeadDeadline` can shut."""
    http = requests.Session()
    adapter = deadlines.adapter_class()()
    http.mount("http://", adapter)
    http.mount("https://", adapter)
    return http


def json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or an empty one (not JSON, nested too deep, not an object)."""
    try:
        return untrusted.mapping(jsondepth.loads(body, 64))
    except (ValueError, RecursionError):
        return {}


TOKEN = re.compile(r"[A-Za-z0-9._~+/-]{1,16384}=*")
"""What a bearer token is made of (RFC 6750): one with a line break in it would be refused as
a header, with the token in the error."""


_QUOTES_CREDENTIALS = re.compile(r"(?i)\b(?:basic|bearer)\s")
LEFT_OUT = "(its words left out: they quote credentials)"


def quotes_credentials(text: str, secrets: list[str]) -> bool:
    """Whether ``text`` (a registry's words, or the engine's, which quote the registry's)
    names an authorization scheme or holds one of the ``secrets`` sent to the registry, in
    any of its usual encodings (a registry echoing the request's Authorization header): such
    words are left out whole (:data:`LEFT_OUT`), not redacted within, as a short password's
    marks would show where it stood."""
    values = {f"registry-secret-{i}": v for i, v in enumerate(secrets) if v}
    return bool(
        _QUOTES_CREDENTIALS.search(text) or (values and Redactor(values).found(text.encode()))
    )


def _scrubbed(text: str, secrets: list[str]) -> str:
    """``text`` (a registry's words) as printable ASCII, cut short; :data:`LEFT_OUT` instead
    when it :func:`quotes_credentials`."""
    text = text[:4096]
    return LEFT_OUT if quotes_credentials(text, secrets) else engine_text(text)


def message(answer: Answer, secrets: list[str]) -> str:
    """The registry's own words for an error (its JSON ``errors``), or its reason phrase:
    without the ``secrets`` this check sent, printable ASCII, cut short."""
    errors = untrusted.array(json_object(answer.body).get("errors"))
    said = "; ".join(
        f"{_scrubbed(_text(untrusted.at(e, 'code')), secrets)}: "
        f"{_scrubbed(_text(untrusted.at(e, 'message')), secrets)}"
        for e in errors[:4]
    )
    return said or _scrubbed(answer.reason, secrets) or f"HTTP {answer.status}"


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
