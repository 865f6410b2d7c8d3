"""Asking a registry, over HTTP, whether it has a pinned manifest, before the engine pulls it.

The engine's pull reports failures as text; the registry's own answer has a status code. So
the runner first asks the registry (``HEAD /v2/<name>/manifests/<digest>``) and decides from
the status: 200 pull; 401/403/404/429 do not retry, say what the registry said
(``image_unavailable``); connection errors, timeouts and 5xx retry with backoff (tenacity)
within a bounded time.

Credentials come from the standard docker config (``$DOCKER_CONFIG/config.json``, else
``~/.docker/config.json``) or a path the policy names, resolved by the docker SDK as the docker
CLI resolves them (``credHelpers``, ``credsStore``, ``auths``); never from the contract, and
they never appear in messages or envelopes (messages say where they came from).
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import requests
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from runner.backends.types import loopback_registry
from runner.core.errors import ImageUnavailable
from runner.images import answers

__all__ = [
    "Credentials",
    "TransientRegistryError",
    "auth_of",
    "credentials_for",
    "docker_config_path",
    "find_credentials",
    "is_insecure",
    "parse_reference",
    "probe",
    "probe_once",
    "secrets_sent",
]

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
    return registry in insecure or loopback_registry(registry)


@dataclass(frozen=True)
class Credentials:
    """What the docker config gives for one registry, and where it came from (``source``: no
    secret, fit for messages)."""

    username: str
    password: str
    source: str = "the docker config"
    identity_token: str | None = None
    """An OAuth2 refresh token (``identitytoken``, or a helper's ``<token>`` user) instead of a
    password."""

    def __repr__(self) -> str:  # never print the secret
        return f"Credentials(username={self.username!r}, password=***, source={self.source!r})"

    def engine_auth(self, registry: str) -> dict[str, str]:
        """The engine's ``X-Registry-Auth`` fields for a pull."""
        if self.identity_token:
            return {"identitytoken": self.identity_token, "serveraddress": registry}
        return {"username": self.username, "password": self.password, "serveraddress": registry}


def docker_config_path(explicit: Path | None = None) -> Path:
    if explicit is not None:
        return explicit
    if os.environ.get("DOCKER_CONFIG"):
        return Path(os.environ["DOCKER_CONFIG"]) / "config.json"
    return Path.home() / ".docker" / "config.json"


def find_credentials(registry: str, config: Path) -> tuple[Credentials | None, str]:
    """Credentials for ``registry`` from the docker config file ``config``, resolved by the
    docker SDK as the docker CLI does: the credential helper ``credHelpers`` names for the
    registry, else the ``credsStore`` helper (``docker-credential-<name>`` on PATH, asked with
    ``get``), else the ``auths`` entry. Returns them (or None) and where they were looked for,
    for messages. A helper that is missing or fails, or a config that cannot be read, raises
    ImageUnavailable naming the registry and the config: the pull would fail anyway, less
    clearly."""
    try:
        text = config.read_text()
    except FileNotFoundError:
        return None, f"{config} (no such file)"
    except OSError as exc:
        raise ImageUnavailable(
            f"cannot read the docker config {config} for {registry}'s credentials: "
            f"{exc.strerror or exc}",
            hint="fix its permissions, or name another file in the policy's dockerConfig",
        ) from exc
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise ImageUnavailable(
            f"the docker config {config} is not JSON ({exc}); it was read for {registry}'s "
            "credentials",
            hint="fix the file (`docker login` writes it), or name another in the policy's "
            "dockerConfig",
        ) from exc
    if not isinstance(data, dict) or not data:
        # The SDK reads an empty dict as "no dict given" and would look elsewhere.
        return None, f"{config} (no credentials in it)"

    import warnings

    import docker.auth
    import docker.errors

    try:
        auth_config = docker.auth.load_config(config_dict=dict(data))  # it pops keys
    except (docker.errors.DockerException, ValueError) as exc:
        raise ImageUnavailable(
            f"the docker config {config} has an entry that cannot be read ({exc}); it was read "
            f"for {registry}'s credentials",
            hint="fix the file (`docker login` writes it), or name another in the policy's "
            "dockerConfig",
        ) from exc
    helper = auth_config.get_credential_store(registry)
    if helper:
        helpers = data.get("credHelpers")
        # The SDK keys Docker Hub's helper by its index URL, as the docker CLI does.
        hub = "https://index.docker.io/v1/" if registry == "docker.io" else registry
        named = isinstance(helpers, dict) and helpers.get(hub) == helper
        key = "credHelpers" if named else "credsStore"
        asked = f"docker-credential-{helper} ({key} in {config})"
        searched = f"{asked}, then the auths of {config}"
    else:
        asked = searched = f"the auths of {config}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the SDK warns when a helper is not on PATH
            found = auth_config.resolve_authconfig(registry)
    except (docker.errors.DockerException, ValueError, KeyError, TypeError) as exc:
        # KeyError, TypeError, ValueError: a helper whose answer is not the protocol's JSON.
        raise ImageUnavailable(
            f"could not get {registry}'s credentials from {asked}: "
            + (
                _sdk_error_text(exc)
                if isinstance(exc, docker.errors.DockerException)
                else "its answer is not the JSON of the credential helper protocol "
                "({ServerURL, Username, Secret})"
            ),
            hint="install the credential helper on PATH (or fix the docker config), or name "
            "another config in the policy's dockerConfig",
        ) from exc
    if not found:
        return None, searched
    # A helper's answer carries "ServerAddress"; an auths entry does not (the SDK falls back
    # to auths when the helper has nothing for the registry).
    source = asked if helper and "ServerAddress" in found else f"the auths of {config}"
    token = found.get("IdentityToken") or None
    username = found.get("Username") or found.get("username") or ""
    password = found.get("Password") or found.get("password") or ""
    if not token and not (username or password):
        return None, searched  # an empty auths entry (`docker login` with a store writes one)
    creds = Credentials(str(username), str(password), source, str(token) if token else None)
    return creds, searched


def _sdk_error_text(exc: Exception) -> str:
    text = str(exc)
    # "Credentials store error: StoreError('docker-credential-x not installed ...')"
    # As re.search(r"StoreError\((['\"])(.*)\1\)", text, re.DOTALL) found it, with str.find:
    # that search backtracked (quadratic in a text repeating StoreError('). The first
    # StoreError( whose quote closes later; what is up to the last close.
    last = {q: text.rfind(q + ")") for q in ("'", '"')}
    inner = text
    start = text.find("StoreError(")
    while start >= 0:
        quote = text[start + 11 : start + 12]
        if quote in last and last[quote] >= start + 12:
            inner = text[start + 12 : last[quote]]
            break
        start = text.find("StoreError(", start + 1)
    return inner.strip()[:500]


def credentials_for(registry: str, config: Path) -> Credentials | None:
    """The credentials for ``registry`` in the docker config ``config`` (auths, credsStore,
    credHelpers), if any."""
    return find_credentials(registry, config)[0]


def auth_of(creds: Credentials | None) -> tuple[str, str] | None:
    return (creds.username, creds.password) if creds and not creds.identity_token else None


# Only from a word's start, and possessive: a registry's header is matched in linear time (a
# search from every letter of a 64 KiB word without ="..." took 20 s).
_CHALLENGE = re.compile(r'\b(\w++)="([^"]*+)"')


def _bearer_token(
    session: requests.Session, challenge: str, creds: Credentials | None, timeout: float, url: str
) -> str | None:
    """A bearer token from the challenge's realm (asked of the registry at ``url``), with the
    credentials only where they stay as private as they were: a realm on plain http named by a
    registry asked over https gets none (an anonymous token, or none)."""
    params = dict(_CHALLENGE.findall(challenge))
    realm = params.pop("realm", None)
    if not realm:
        return None
    if urlsplit(url).scheme == "https" and urlsplit(realm).scheme != "https":
        creds = None
    if creds is not None and creds.identity_token:
        # OAuth2 refresh-token grant, as the docker CLI does with an identity token.
        form = {
            **params,
            "grant_type": "refresh_token",
            "refresh_token": creds.identity_token,
            "client_id": "runner",
        }
        answer = answers.ask(session, "POST", realm, timeout, data=form)
    else:
        answer = answers.ask(session, "GET", realm, timeout, params=params, auth=auth_of(creds))
    if answer.status != 200:
        return None
    body = answers.json_object(answer.body)
    token = body.get("token") or body.get("access_token")
    # Only what a bearer token is made of (RFC 6750): one with a line break in it would be
    # refused as a header, with the token in the error.
    return token if isinstance(token, str) and answers.TOKEN.fullmatch(token) else None


def secrets_sent(creds: Credentials | None) -> list[str]:
    """What a check (or the engine's pull) may send a registry that its answer must not be
    quoted with: the password, ``user:password`` and its base64 (a Basic header), the identity
    token."""
    if creds is None:
        return []
    pair = f"{creds.username}:{creds.password}"
    basic = base64.b64encode(pair.encode()).decode()
    return [creds.password, pair, basic, creds.identity_token or ""]


def probe_once(
    ref: Reference,
    creds: Credentials | None,
    *,
    insecure: bool,
    timeout: float,
    searched: str = "the docker config",
) -> None:
    """One manifest HEAD; raises ImageUnavailable (final) or TransientRegistryError.
    ``searched`` says where credentials were looked for (for a 401 or 403 message)."""
    scheme = "http" if insecure else "https"
    url = f"{scheme}://{ref.api_host}/v2/{ref.repository}/manifests/{ref.digest}"
    headers = {"Accept": MANIFEST_TYPES}
    sent = secrets_sent(creds)
    with answers.session() as session:
        try:
            resp = answers.ask(session, "HEAD", url, timeout, headers=headers)
            # A challenge from a host a redirect led to is not the registry's: answering it
            # would send the credentials (to a token realm it names) where they do not go.
            if resp.status == 401 and answers.keeps_credentials(url, resp.url):
                challenge = resp.challenge
                if challenge.lower().startswith("bearer"):
                    token = _bearer_token(session, challenge, creds, timeout, url)
                    if token:
                        sent.append(token)
                        headers["Authorization"] = f"Bearer {token}"
                        resp = answers.ask(session, "HEAD", url, timeout, headers=headers)
                elif auth_of(creds) is not None:
                    resp = answers.ask(
                        session, "HEAD", url, timeout, headers=headers, auth=auth_of(creds)
                    )
            if 400 <= resp.status < 500:
                # A HEAD answer has no body: ask again for the registry's own error message,
                # with the same credentials (a bearer token if one was obtained, else basic).
                basic = None if "Authorization" in headers else auth_of(creds)
                resp = answers.ask(session, "GET", url, timeout, headers=headers, auth=basic)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise TransientRegistryError(
                f"{ref.registry} did not answer ({type(exc).__name__})"
            ) from exc
    status = resp.status
    if status == 200:
        return
    if status >= 500:
        raise TransientRegistryError(
            f"{ref.registry} answered {status}: {answers.message(resp, sent)}"
        )
    if status == 401:
        what = (
            f"refused the credentials from {creds.source}"
            if creds is not None
            else f"asked for credentials, and none were found for it in {searched}"
        )
    elif status == 403:
        what = "denied access " + (
            f"(credentials from {creds.source})"
            if creds is not None
            else f"(no credentials found for it in {searched})"
        )
    else:
        what = {
            404: "does not have that manifest",
            429: "is rate-limiting this host",
        }.get(status, f"answered {status}")
    hint = {
        401: f"log in to {ref.registry} (`docker login {ref.registry}` writes the docker "
        "config's auths, or its credsStore or credHelpers helper), or name another config in "
        "the policy's dockerConfig",
        403: "check that the account may pull this repository",
        429: "wait and run again later; the runner does not hammer a rate-limited registry",
    }.get(status, "check the digest and the repository name")
    raise ImageUnavailable(
        f"{ref.registry} {what}: {ref.repository}@{ref.digest} ({answers.message(resp, sent)})",
        hint=hint,
    )


def probe(
    ref: Reference,
    creds: Credentials | None,
    *,
    insecure: bool,
    within_seconds: float = 120.0,
    request_timeout: float = 15.0,
    searched: str = "the docker config",
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
                probe_once(
                    ref, creds, insecure=insecure, timeout=request_timeout, searched=searched
                )
    except RetryError as exc:
        last = exc.last_attempt.exception()
        error = ImageUnavailable(
            f"{ref.registry} kept failing for {within_seconds:g} s ({tries} tries): {last}",
            hint="the registry or the network to it is down; run again later",
        )
        error.retryable = True
        raise error from last
    return tries
