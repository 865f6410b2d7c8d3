"""The seventeenth hostile review, registry and egress proxy: secrets the runner's own checks
kept out, let in by words it did not check.

- A registry (the contract names it) that echoes the credentials the engine sent it got the
  host's registry password into ``failure.reason``, so into ``result.json``, ``--json`` and
  the exported bundle: the engine's pull error (its stream's ``error``, or the Engine API's
  answer to the pull, ``exc.explanation``) went there unfiltered, where the runner's own
  probe of the registry leaves such words out. The engine's error for a pull (and a load) is
  now checked the same way (``runner.images.answers.quotes_credentials``, with the secrets of
  ``runner.images.registry.secrets_sent``) and left out whole when it quotes credentials.
- The egress proxy lower-cases a ``CONNECT`` host; neither its own blanking nor the runner's
  ``Redactor`` folded case, so ``CONNECT <KEY>.example:443`` put the key, lower-cased, into
  egress.log, the envelope's ``egress.connections[].host`` and the signed result.
- The proxy's engine log kept the key's hex or base64 whole when a stray ``%`` before it ate
  its first two characters on percent-decoding and one of its other characters was
  percent-encoded: its digests covered ``value[2:]`` but not ``form[2:]`` of the encoded forms.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
import urllib.parse
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from runner.core.errors import ImageUnavailable, InfrastructureError, RunnerError
from runner.core.redaction import REDACTED, Redactor
from runner.images import answers, pins, registry
from runner.testing import FakeBackend
from tests.unit.test_hostile_secrets import _proxy

PASSWORD = "Reg1stryPassw0rd-TOPSECRET"  # noqa: S105  (made up, for the test)
USER = "alice"
HOST = "registry.example"
DIGEST = "sha256:" + "ab" * 32


class _Progress:
    def stage(self, name: str, detail: str) -> None:
        pass

    def transfer(self, label: str, done: int, total: int) -> None:
        pass


def _pull_failing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: RunnerError
) -> RunnerError:
    """What a pull raises when the registry answers the runner's probe but the engine's pull
    fails with ``error`` (credentials for the registry in the host's docker config)."""
    monkeypatch.setattr(registry, "probe", lambda *_, **__: 1)
    monkeypatch.setattr(registry, "probe_once", lambda *_, **__: None)
    pair = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"auths": {HOST: {"auth": pair}}}))
    backend = FakeBackend()
    backend.fail["pull"] = error
    pin = pins.parse_pin(f"{HOST}/lab/eval@{DIGEST}", None, allow_unpinned=False)
    with pytest.raises(RunnerError) as raised:
        pins._pull(backend, pin, pins.PullSettings(docker_config=config), _Progress())
    return raised.value


ECHOES = {
    "as it is": f"denied: account {USER}:{PASSWORD} is suspended",
    "the Basic header's base64": "denied: got "
    + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode().rstrip("="),
    "hex": f"denied: {PASSWORD.encode().hex()}",
    "percent-encoded": "denied: " + "".join(f"%{b:02X}" for b in PASSWORD.encode()),
    "an authorization scheme": "denied: you sent Bearer eyJhbGciOi.xyz",
}


@pytest.mark.parametrize("said", ECHOES.values(), ids=ECHOES.keys())
def test_the_engines_pull_error_quoting_the_credentials_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, said: str
) -> None:
    """The Engine API's answer to a pull (``_sdk_errors``: "the engine answered 404: ...
    denied: account alice:PASSWORD is suspended") went into ``failure.reason`` as it was: a
    registry echoing what the engine sent it put the host's registry password into
    ``result.json``, ``--json`` and the bundle. Now the engine's words are left out whole."""
    error = InfrastructureError(
        f"pulling {HOST}/lab/eval@{DIGEST}: the engine answered 404: pull access denied: {said}"
    )
    raised = _pull_failing(tmp_path, monkeypatch, error)
    assert type(raised) is InfrastructureError and raised.retryable
    assert PASSWORD not in str(raised) and "Bearer" not in str(raised)
    assert str(raised).endswith(answers.LEFT_OUT)
    assert f"the engine could not pull {HOST}/lab/eval@{DIGEST}" in str(raised)


def test_the_engines_pull_stream_error_quoting_the_password_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pull stream's ``error``/``errorDetail`` (``DockerBackend.pull``: "the engine could
    not pull REF: ...") quoting the password went into ``failure.reason`` as it was; the
    Podman backend's pull error the same. Now left out whole, its hint kept."""
    error = ImageUnavailable(
        f"the engine could not pull {HOST}/lab/eval@{DIGEST}: {ECHOES['as it is']}",
        hint="check the registry and the digest",
    )
    raised = _pull_failing(tmp_path, monkeypatch, error)
    assert isinstance(raised, ImageUnavailable) and PASSWORD not in str(raised)
    assert raised.message.endswith(answers.LEFT_OUT) and raised.hint == error.hint
    assert raised.__cause__ is None and raised.__suppress_context__


def test_the_engines_pull_error_without_credentials_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine error that quotes no credentials is raised as the engine's backend made it."""
    error = ImageUnavailable("the engine could not pull x: manifest unknown")
    assert _pull_failing(tmp_path, monkeypatch, error) is error


def test_the_engines_load_error_naming_an_authorization_scheme_is_left_out(
    tmp_path: Path,
) -> None:
    """A bundle's load error went into ``failure.reason`` as the engine said it; a load sends
    the registry no credentials, but words naming an authorization scheme are left out as a
    pull's are."""
    bundle = tmp_path / "bundle.tar"
    with tarfile.open(bundle, "w") as tar:
        for name, data in (("c.json", b"{}"), ("manifest.json", b'[{"Config": "c.json"}]')):
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    backend = FakeBackend()
    backend.fail["load"] = ImageUnavailable("the engine could not load it: Basic YWxpY2U6cHc=")
    with pytest.raises(ImageUnavailable) as raised:
        pins.load_bundle(backend, bundle, None)
    assert "YWxpY2U6cHc" not in str(raised.value) and answers.LEFT_OUT in str(raised.value)


# --- the egress proxy and the redaction step: case, and a stray "%" -------------------------

KEY = "sk-ant-api03-Rk7QmXz2LpV9wTnB4cYhJ8dFgS1eUoA6iKqM3rNvPbWxZyC0tE5uGlHjO-Dk9sQ2AA"
"""Made up, mixed-case, as an Anthropic key is."""


def _lower_b64_host() -> str:
    """The key's URL-safe base64, lower-cased as the proxy logs a host: no protection (all
    but a few of its groups of four decode to printable ASCII in one case only)."""
    return base64.urlsafe_b64encode(KEY.encode()).decode().rstrip("=").lower() + ".example"


def _pct_one(text: str, at: int) -> str:
    return text[:at] + f"%{ord(text[at]):02X}" + text[at + 1 :]


def test_the_redaction_step_finds_a_value_in_any_case() -> None:
    """``CONNECT <KEY>.example:443``: the proxy logs the host lower-cased, and the Redactor
    matched the value as it is only: the lower-cased key went into egress.log, egress.json,
    the envelope's ``egress.connections[].host`` and the signed result. Its base64,
    lower-cased, the same."""
    redactor = Redactor({"API_KEY": KEY})
    mark = REDACTED.format(name="API_KEY")
    for seen in (
        f"{KEY.lower()}.example",
        f"{KEY.upper()}.example",
        _lower_b64_host(),
        "x%" + KEY.lower(),  # a stray "%" eats "sk"
        "GET /" + urllib.parse.quote(KEY.lower(), safe=""),
    ):
        assert redactor.found(seen.encode()) == ["API_KEY"], seen
        assert KEY.lower()[4:] not in redactor.text(seen).lower() and mark in redactor.text(seen)
    with io.BytesIO(f"host: {KEY.lower()}.example\n".encode() * 3) as f:
        out = io.BytesIO()
        assert redactor.stream(f, out) == ["API_KEY"]
        assert KEY.lower().encode() not in out.getvalue()


def _proxy_for(lease: str) -> ModuleType:
    proxy = _proxy()
    proxy.Rules._parse({"lease": lease, "allow": [], "redact": Redactor({"K": KEY}).proxy_rules()})
    return proxy


def test_the_proxy_blanks_a_host_it_lower_cased() -> None:
    """The proxy lower-cases a ``CONNECT`` host (``hostport()``) and its digests were of the
    value as it is: ``CONNECT <KEY>.example:443`` left the lower-cased key in its engine log
    (the host field of its "request" and "refused" lines), which the engine keeps for the
    slot's life. Its lower-cased base64 as a host, the same."""
    proxy = _proxy_for("L")
    for target in (f"{KEY}.example:443", _lower_b64_host().upper() + ":443"):
        host = proxy.hostport(target, 443)[0]
        assert host == host.lower() and proxy.redacted("L", host) == "[redacted: K]", target


def test_the_proxy_blanks_an_encoded_form_a_stray_percent_cut_short() -> None:
    """``GET http://allowed/x%<hex of KEY, one digit percent-encoded>``: decoded, the stray
    ``%`` eats the hex's first two digits, and the percent-encoded one keeps the field as it is
    from matching: the proxy's digests had ``value[2:]`` but not the encoded forms' ``[2:]``,
    so its engine log kept the whole key in hex (or base64)."""
    proxy = _proxy_for("L")
    hexed = KEY.encode().hex()
    for form in (hexed, hexed.upper(), base64.b64encode(KEY.encode()).decode()):
        field = "http://api.test/x%" + _pct_one(form, 20)
        assert proxy.redacted("L", field) == "[redacted: K]", form[:8]


def test_a_plain_http_realm_of_an_https_registry_gets_no_credentials() -> None:
    """A registry asked over https whose challenge names a token realm on plain http: the
    check sent it the password (Basic) or the identity token, in the clear. Now such a realm
    is asked for an anonymous token; a registry the host reaches over plain http anyway (an
    insecure one) still sends them to its realm."""
    from tests.unit.test_hostile_review_round16 import _registry_server

    seen: list[str | None] = []

    def token(h: Any) -> None:
        seen.append(h.headers.get("Authorization"))
        body = b'{"token": "t0k3n"}'
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    server = _registry_server({"/token": token})
    creds = registry.Credentials("u", "hunter2", "test")
    challenge = f'Bearer realm="http://127.0.0.1:{server.server_address[1]}/token",service="r"'
    try:
        for asked_over in ("https://registry.example", "http://127.0.0.1:5000"):
            with answers.session() as session:
                got = registry._bearer_token(session, challenge, creds, 5, asked_over + "/v2/")
            assert got == "t0k3n"
    finally:
        server.shutdown()
        server.server_close()
    assert seen[0] is None and seen[1] is not None and seen[1].startswith("Basic ")


def test_hex_wrapped_with_bare_carriage_returns_is_found() -> None:
    """The key's hex wrapped at 60 with a bare ``\\r`` (no ``\\n``): the wrap allowed ``\\r?\\n``
    only, so an agent that wrapped it so kept it whole in what the runner wrote."""
    hexed = KEY.encode().hex().encode()
    wrapped = b"\r".join(hexed[i : i + 60] for i in range(0, len(hexed), 60))
    assert Redactor({"API_KEY": KEY}).bytes(b"x " + wrapped + b" y") == (
        b"x " + REDACTED.format(name="API_KEY").encode() + b" y"
    )


def test_a_secret_that_begins_another_leaves_no_tail() -> None:
    """Two secrets, one the other's beginning: the shorter was tried first and matched, the
    longer's tail stayed in the text. The longer is now looked for first."""
    short, long_ = "sk-shared-prefix-0123456789", "sk-shared-prefix-0123456789-XYZSECRETTAIL"
    out = Redactor({"A": short, "B": long_}).bytes(f"a {long_} b {short} c".encode())
    assert out == b"a [redacted: B] b [redacted: A] c"


def test_a_challenge_from_a_host_a_redirect_led_to_gets_no_credentials() -> None:
    """The manifest HEAD redirected to another host, whose 401 names a token realm: the
    check sent the registry's password there (the redirect dropped the credentials, the token
    request it led to did not). A challenge from another host than the registry is now a
    final 401: nothing is sent to its realm."""
    from tests.unit.test_hostile_review_round16 import _moved, _registry_server

    seen: list[tuple[str, str | None]] = []

    def thief(h: Any) -> None:
        seen.append(("realm", h.headers.get("Authorization")))
        h.send_response(403)
        h.send_header("Content-Length", "0")
        h.end_headers()

    realm = _registry_server({"/token": thief})

    def challenge(h: Any) -> None:
        seen.append(("foreign", h.headers.get("Authorization")))
        h.send_response(401)
        port = realm.server_address[1]
        h.send_header("WWW-Authenticate", f'Bearer realm="http://127.0.0.1:{port}/token"')
        h.send_header("Content-Length", "0")
        h.end_headers()

    digest = "sha256:" + "a" * 64
    path = f"/v2/team/app/manifests/{digest}"
    foreign = _registry_server({path: challenge})
    moved = _registry_server(
        {path: _moved(f"http://127.0.0.1:{foreign.server_address[1]}{path}", 307)}
    )
    ref = registry.parse_reference(f"127.0.0.1:{moved.server_address[1]}/team/app", digest)
    try:
        with pytest.raises(ImageUnavailable, match=r"asked for credentials|refused"):
            registry.probe_once(ref, registry.Credentials("alice", "hunter2-pw"), insecure=True,
                                timeout=5)  # fmt: skip
    finally:
        for server in (realm, foreign, moved):
            server.shutdown()
            server.server_close()
    assert ("foreign", None) in seen and [who for who, _ in seen].count("realm") == 0, seen
    assert all(auth is None for _, auth in seen), seen


def test_the_engines_words_about_a_pull_are_printable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's error for a pull quotes the registry's words as they came: escape
    sequences went into ``failure.reason`` and the human summary printed them to the
    terminal. Now they are printable ASCII, cut to 1,000 characters."""
    from runner.backends.docker import DockerBackend

    class _Sdk:
        def pull(self, *_: Any, **__: Any) -> Any:
            yield {"errorDetail": {"message": "denied \x1b]0;owned\x07\x1b[2J" + "x" * 5000}}

    backend = DockerBackend()
    monkeypatch.setattr(backend, "_sdk_client", _Sdk)
    with pytest.raises(ImageUnavailable) as raised:
        backend.pull("registry.example/lab/eval@" + DIGEST, None, lambda chunk: None)
    said = raised.value.message
    assert "\x1b" not in said and "\x07" not in said and "denied ?]0;owned" in said
    assert len(said) < 1200
