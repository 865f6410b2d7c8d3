"""Asking a registry, over HTTP, whether it has a pinned manifest, before the engine pulls it.

The engine's pull reports failures as text; the registry's own answer has a status code. So
the runner first asks the registry (``HEAD /v2/<name>/manifests/<digest>``) and decides from
the status: 200 pull; 401/403/404/429 do not retry, say what the registry said
(``image_unavailable``); connection errors, timeouts and 5xx retry with backoff (tenacity)
within a bounded time.

Credentials come from the standard docker config (``~/.docker/config.json``, ``auths``) or a
path the policy names, never from the contract, and never appear in messages or envelopes.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import requests
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from runner.errors import ImageUnavailable

MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)


class TransientRegistryError(Exception):
    """A failure worth retrying: the registry or the path to it may recover."""


@dataclass(frozen=True)
class Reference:
    """``registry/repository@digest`` split the way registries and the engine see it."""

    registry: str
    repository: str
    digest: str

    @property
    def api_host(self) -> str:
        return "registry-1.docker.io" if self.registry == "docker.io" else self.registry

    @property
    def pull_name(self) -> str:
        """What the engine is asked to pull."""
        if self.registry == "docker.io":
            short = self.repository.removeprefix("library/")
            return f"{short}@{self.digest}"
        return f"{self.registry}/{self.repository}@{self.digest}"


def parse_reference(name: str, digest: str) -> Reference:
    """``localhost:5000/lab/eval`` + digest → Reference; bare names are Docker Hub's."""
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
    else:
        registry, repository = "docker.io", name
        if "/" not in repository:
            repository = f"library/{repository}"
    repository = repository.split(":", 1)[0] if ":" in repository.rsplit("/", 1)[-1] else repository
    return Reference(registry, repository, digest)


def is_insecure(registry: str, insecure: tuple[str, ...] = ()) -> bool:
    """Plain HTTP for loopback registries (as the engine does) and those the policy lists."""
    if registry in insecure:
        return True
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def __repr__(self) -> str:  # never print the secret
        return f"Credentials(username={self.username!r}, password=***)"


def docker_config_path(explicit: Path | None = None) -> Path:
    if explicit is not None:
        return explicit
    if os.environ.get("DOCKER_CONFIG"):
        return Path(os.environ["DOCKER_CONFIG"]) / "config.json"
    return Path.home() / ".docker" / "config.json"


def credentials_for(registry: str, config: Path) -> Credentials | None:
    """The ``auths`` entry for ``registry`` in a docker config file, if any."""
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    auths = data.get("auths") or {}
    keys = [registry, f"https://{registry}", f"http://{registry}"]
    if registry == "docker.io":
        keys += ["https://index.docker.io/v1/", "index.docker.io"]
    for key in keys:
        entry = auths.get(key)
        if isinstance(entry, dict) and entry.get("auth"):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return None
            return Credentials(user, password)
    return None


def auth_of(creds: Credentials | None) -> tuple[str, str] | None:
    return (creds.username, creds.password) if creds else None


_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


def _bearer_token(
    session: requests.Session, challenge: str, creds: Credentials | None, timeout: float
) -> str | None:
    params = dict(_CHALLENGE.findall(challenge))
    realm = params.pop("realm", None)
    if not realm:
        return None
    auth = (creds.username, creds.password) if creds else None
    resp = session.get(realm, params=params, auth=auth, timeout=timeout)
    if resp.status_code != 200:
        return None
    body = resp.json()
    token = body.get("token") or body.get("access_token")
    return str(token) if token else None


def _message(resp: requests.Response) -> str:
    try:
        errors = resp.json().get("errors") or []
        if errors:
            return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)
    except ValueError:
        pass
    return resp.reason or f"HTTP {resp.status_code}"


def probe_once(
    ref: Reference, creds: Credentials | None, *, insecure: bool, timeout: float
) -> None:
    """One manifest HEAD; raises ImageUnavailable (final) or TransientRegistryError."""
    scheme = "http" if insecure else "https"
    url = f"{scheme}://{ref.api_host}/v2/{ref.repository}/manifests/{ref.digest}"
    headers = {"Accept": MANIFEST_TYPES}
    with requests.Session() as session:
        try:
            resp = session.head(url, headers=headers, timeout=timeout)
            if resp.status_code == 401:
                challenge = resp.headers.get("WWW-Authenticate", "")
                if challenge.lower().startswith("bearer"):
                    token = _bearer_token(session, challenge, creds, timeout)
                    if token:
                        headers["Authorization"] = f"Bearer {token}"
                        resp = session.head(url, headers=headers, timeout=timeout)
                elif creds is not None:
                    auth = (creds.username, creds.password)
                    resp = session.head(url, headers=headers, timeout=timeout, auth=auth)
            if 400 <= resp.status_code < 500:
                # A HEAD answer has no body: ask again for the registry's own error message,
                # with the same credentials (a bearer token if one was obtained, else basic).
                basic = None if "Authorization" in headers else auth_of(creds)
                resp = session.get(url, headers=headers, timeout=timeout, auth=basic)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise TransientRegistryError(
                f"{ref.registry} did not answer ({type(exc).__name__})"
            ) from exc
    status = resp.status_code
    if status == 200:
        return
    if status >= 500:
        raise TransientRegistryError(f"{ref.registry} answered {status}: {_message(resp)}")
    what = {
        401: "refused the credentials (or none were found in the docker config)",
        403: "denied access",
        404: "does not have that manifest",
        429: "is rate-limiting this host",
    }.get(status, f"answered {status}")
    raise ImageUnavailable(
        f"{ref.registry} {what}: {ref.repository}@{ref.digest} ({_message(resp)})",
        hint="check the digest and the repository name; for a private registry put its "
        "credentials in the docker config (`docker login`)"
        if status != 429
        else "wait and run again later; the runner does not hammer a rate-limited registry",
    )


def probe(
    ref: Reference,
    creds: Credentials | None,
    *,
    insecure: bool,
    within_seconds: float = 120.0,
    request_timeout: float = 15.0,
) -> int:
    """Probe until the registry answers for good or ``within_seconds`` pass; return how many
    tries it took. Transient failures past the bound become ImageUnavailable (retryable)."""
    retrying = Retrying(
        retry=retry_if_exception_type(TransientRegistryError),
        stop=stop_after_delay(within_seconds),
        wait=wait_exponential(multiplier=0.5, max=10),
        reraise=False,
    )
    tries = 0
    try:
        for attempt in retrying:
            with attempt:
                tries += 1
                probe_once(ref, creds, insecure=insecure, timeout=request_timeout)
    except RetryError as exc:
        last = exc.last_attempt.exception()
        error = ImageUnavailable(
            f"{ref.registry} kept failing for {within_seconds:g} s ({tries} tries): {last}",
            hint="the registry or the network to it is down; run again later",
        )
        error.retryable = True
        raise error from last
    return tries
