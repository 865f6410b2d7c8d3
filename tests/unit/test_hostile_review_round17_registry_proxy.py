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
from pathlib import Path

import pytest

from runner.core.errors import ImageUnavailable, InfrastructureError, RunnerError
from runner.images import answers, pins, registry
from runner.testing import FakeBackend

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
