"""Private registries: credentials from the docker config as the docker CLI finds them, through
the docker SDK (``credHelpers``, ``credsStore``, ``auths``). Debian's docker-registry on
127.0.0.1 with real htpasswd basic auth (``htpasswd`` from apache2-utils), and a real
credential helper executable, ``docker-credential-runnertest``, that speaks the helper protocol
(``store``/``get``/``erase``/``list``) and that ``docker login`` itself fills."""

from __future__ import annotations

import base64
import http.server
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from runner.core.errors import ImageUnavailable
from runner.images import registry
from tests.support import docker, run_job, write_contract

pytestmark = pytest.mark.docker

USER = "runner-test"
HELPER = """#!{python}
# A docker credential helper (protocol: github.com/docker/docker-credential-helpers) keeping
# its credentials in one JSON file. It logs each call's action and server, never a secret.
import json, sys
from pathlib import Path

store, log = Path({store!r}), Path({log!r})
action, data = sys.argv[1], sys.stdin.read()
creds = json.loads(store.read_text()) if store.exists() else {{}}
server = json.loads(data)["ServerURL"] if action == "store" else data.strip()
with log.open("a") as f:
    f.write(f"{{action}} {{server}}\\n")
if action == "store":
    entry = json.loads(data)
    creds[server] = [entry["Username"], entry["Secret"]]
    store.write_text(json.dumps(creds))
elif action == "get":
    if server not in creds:
        print("credentials not found in native keychain")
        sys.exit(1)
    user, secret = creds[server]
    print(json.dumps({{"ServerURL": server, "Username": user, "Secret": secret}}))
elif action == "erase":
    creds.pop(server, None)
    store.write_text(json.dumps(creds))
elif action == "list":
    print(json.dumps({{url: pair[0] for url, pair in creds.items()}}))
else:
    sys.exit(f"unknown action {{action}}")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_helper(bin_dir: Path, name: str, creds: dict[str, list[str]] | None = None) -> Path:
    """``bin_dir/docker-credential-<name>``, its store holding ``creds``; returns its log."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    store, log = bin_dir / f"{name}.store.json", bin_dir / f"{name}.log"
    store.write_text(json.dumps(creds or {}))
    store.chmod(0o600)
    exe = bin_dir / f"docker-credential-{name}"
    exe.write_text(HELPER.format(python=sys.executable, store=str(store), log=str(log)))
    exe.chmod(0o700)
    return log


@dataclass(frozen=True)
class Private:
    host: str
    password: str
    repo: str
    digest: str
    image_id: str
    helper_bin: Path
    helper_log: Path


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory, image_id: str) -> Iterator[Private]:
    """docker-registry on 127.0.0.1 requiring basic auth, and an image pushed there by an
    engine logged in through the credential helper, then removed locally."""
    binary, htpasswd = shutil.which("docker-registry"), shutil.which("htpasswd")
    if binary is None or htpasswd is None:
        pytest.fail("docker-registry or htpasswd (apache2-utils) missing: run scripts/setup.sh")
    root = tmp_path_factory.mktemp("auth-registry")
    password = secrets.token_urlsafe(18)  # made here, for this test only
    made = subprocess.run(
        [htpasswd, "-Bbc", str(root / "htpasswd"), USER, password],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    port = _free_port()
    host = f"127.0.0.1:{port}"
    (root / "config.yml").write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: {host}\n"
        f"auth:\n  htpasswd:\n    realm: runner-test\n    path: {root / 'htpasswd'}\n"
    )
    log = (root / "registry.log").open("wb")
    proc = subprocess.Popen([binary, "serve", str(root / "config.yml")], stdout=log, stderr=log)
    helper_bin = root / "bin"
    helper_log = make_helper(helper_bin, "runnertest")
    unique_id = ""
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if requests.get(f"http://{host}/v2/", timeout=1).status_code == 401:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"docker-registry did not start: {(root / 'registry.log').read_text()}")
            time.sleep(0.1)

        # The engine logs in through the helper: `docker login` calls its `store`.
        login_dir = root / "login-config"
        login_dir.mkdir()
        (login_dir / "config.json").write_text(json.dumps({"credHelpers": {host: "runnertest"}}))
        cli_env = {**os.environ, "PATH": f"{helper_bin}:{os.environ['PATH']}"}

        def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["docker", "--config", str(login_dir), *args],
                input=stdin,
                capture_output=True,
                text=True,
                env=cli_env,
                check=False,
            )

        # Refused before the login: the registry really requires credentials.
        tag = f"runner-test/private:{uuid.uuid4().hex[:12]}"
        built = cli(
            "build", "-q", "--network", "none", "-t", tag, "-",
            stdin=f"FROM {image_id}\nLABEL org.runner.test={uuid.uuid4().hex}\n",
        )  # fmt: skip
        assert built.returncode == 0, built.stderr
        unique_id = json.loads(docker("image", "inspect", tag).stdout)[0]["Id"]
        repo = f"{host}/runner/private"
        remote = f"{repo}:{tag.rsplit(':', 1)[1]}"
        assert cli("tag", tag, remote).returncode == 0
        refused = cli("push", remote)
        assert refused.returncode != 0 and "no basic auth credentials" in refused.stderr, refused
        login = cli("login", host, "-u", USER, "--password-stdin", stdin=password)
        assert login.returncode == 0, login.stderr
        assert f"store {host}" in helper_log.read_text()
        assert password not in (login_dir / "config.json").read_text()
        push = cli("push", remote)
        assert push.returncode == 0, push.stderr
        digests = json.loads(docker("image", "inspect", remote).stdout)[0]["RepoDigests"]
        digest = next(d for d in digests if d.startswith(repo + "@")).split("@", 1)[1]
        assert docker("rmi", "-f", unique_id).returncode == 0
        yield Private(host, password, repo, digest, unique_id, helper_bin, helper_log)
    finally:
        if unique_id:
            docker("rmi", "-f", unique_id)
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def _config(folder: Path, data: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(data))
    return folder / "config.json"


def _path_with(bin_dir: Path | None) -> str:
    return f"{bin_dir}:{os.environ['PATH']}" if bin_dir else os.environ["PATH"]


def _run(
    tmp_path: Path, p: Private, env: dict[str, str], *extra: str
) -> tuple[int, dict[str, Any], str]:
    assert docker("image", "inspect", p.image_id).returncode != 0, "the image must be pulled"
    contract = write_contract(tmp_path, f"{p.repo}@{p.digest}", environment={"imageId": p.image_id})
    try:
        return run_job(contract, tmp_path / "state", *extra, env=env)
    finally:
        docker("rmi", "-f", p.image_id)


def _assert_no_secret(p: Private, tmp_path: Path, env: dict[str, Any], stderr: str) -> None:
    """The password (plain or in a basic-auth blob) is nowhere the run wrote: envelope,
    stderr, ledger, job folder, state folder."""
    blob = base64.b64encode(f"{USER}:{p.password}".encode())
    texts = [json.dumps(env).encode(), stderr.encode()]
    files = [f for f in (tmp_path / "state").rglob("*") if f.is_file() and not f.is_symlink()]
    assert any(f.name == "ledger.jsonl" for f in files), "the run kept a ledger"
    texts += [f.read_bytes() for f in files]
    for text in texts:
        assert p.password.encode() not in text and blob not in text


def test_credential_helper_named_by_cred_helpers(tmp_path: Path, private: Private) -> None:
    """credHelpers → docker-credential-runnertest → `get` → the pull succeeds; the debug log
    (on stderr) holds no secret either."""
    config = _config(tmp_path / "docker", {"credHelpers": {private.host: "runnertest"}})
    calls = len(private.helper_log.read_text().splitlines())
    code, env, stderr = _run(
        tmp_path,
        private,
        {
            "DOCKER_CONFIG": str(config.parent),
            "PATH": _path_with(private.helper_bin),
            "RUNNER_LOG_LEVEL": "debug",
        },
    )
    assert code == 0, (env, stderr)
    assert env["image"]["source"] == "pulled" and env["image"]["id"] == private.image_id
    assert env["image"]["repoDigest"] == f"{private.repo}@{private.digest}"
    assert env["measurements"][0]["value"] == 0.819
    assert "runner: debug: " in stderr or "runner: info: " in stderr, "the log was on"
    asked = private.helper_log.read_text().splitlines()[calls:]
    assert f"get {private.host}" in asked
    assert (
        f"credentials for {private.host} from docker-credential-runnertest (credHelpers in "
        f"{config})" in stderr
    )
    _assert_no_secret(private, tmp_path, env, stderr)


def test_creds_store_through_the_policys_docker_config(tmp_path: Path, private: Private) -> None:
    """credsStore in the file the policy's dockerConfig names; $DOCKER_CONFIG (wrong
    credentials) is not read."""
    config = _config(tmp_path / "docker", {"credsStore": "runnertest"})
    wrong = base64.b64encode(f"{USER}:not-{private.password}".encode()).decode()
    ignored = _config(tmp_path / "ignored", {"auths": {private.host: {"auth": wrong}}})
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"dockerConfig": str(config)}))
    code, env, stderr = _run(
        tmp_path,
        private,
        {"DOCKER_CONFIG": str(ignored.parent), "PATH": _path_with(private.helper_bin)},
        "--policy",
        str(policy),
    )
    assert code == 0, (env, stderr)
    assert env["image"]["source"] == "pulled"
    assert f"from docker-credential-runnertest (credsStore in {config})" in stderr
    _assert_no_secret(private, tmp_path, env, stderr)


def test_inline_auths_still_work(tmp_path: Path, private: Private) -> None:
    blob = base64.b64encode(f"{USER}:{private.password}".encode()).decode()
    config = _config(tmp_path / "docker", {"auths": {f"http://{private.host}": {"auth": blob}}})
    code, env, stderr = _run(tmp_path, private, {"DOCKER_CONFIG": str(config.parent)})
    assert code == 0, (env, stderr)
    assert env["image"]["source"] == "pulled"
    assert f"credentials for {private.host} from the auths of {config}" in stderr
    _assert_no_secret(private, tmp_path, env, stderr)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            "helper-not-on-path",
            [
                "could not get {host}'s credentials from docker-credential-runnertest "
                "({key} in {config})",
                "docker-credential-runnertest not installed or not available in PATH",
            ],
        ),
        (
            "wrong-password",
            [
                "{host} refused the credentials from docker-credential-wrongpw ({key} in {config})",
                "UNAUTHORIZED",
            ],
        ),
        (
            "helper-has-none",
            [
                "{host} asked for credentials, and none were found for it in "
                "docker-credential-empty ({key} in {config}), then the auths of {config}:",
                "UNAUTHORIZED",
            ],
        ),
    ],
)
@pytest.mark.parametrize("key", ["credHelpers", "credsStore"])
def test_missing_or_wrong_credentials_are_refused_clearly(
    tmp_path: Path, private: Private, case: str, expected: list[str], key: str
) -> None:
    """Each fails image_unavailable (not retried), naming the registry and where the
    credentials were looked for; the password appears nowhere."""
    bin_dir = tmp_path / "bin"
    helper = {"helper-not-on-path": "runnertest", "wrong-password": "wrongpw"}.get(case, "empty")
    make_helper(bin_dir, "wrongpw", {private.host: [USER, "not-" + private.password]})
    make_helper(bin_dir, "empty", {"127.0.0.1:1": [USER, private.password]})
    entry = {private.host: helper} if key == "credHelpers" else helper
    config = _config(tmp_path / "docker", {key: entry})
    env = {"DOCKER_CONFIG": str(config.parent), "PATH": _path_with(bin_dir)}
    code, envelope, stderr = _run(tmp_path, private, env)
    assert code == 4, (envelope, stderr)
    failure = envelope["failure"]
    assert failure["category"] == "image_unavailable" and failure["retryable"] is False
    assert envelope["container"] is None
    for text in expected:
        assert text.format(host=private.host, key=key, config=config) in failure["reason"]
    _assert_no_secret(private, tmp_path, envelope, stderr)


def test_no_docker_config_at_all(tmp_path: Path, private: Private) -> None:
    config = tmp_path / "docker" / "config.json"
    code, envelope, _ = _run(tmp_path, private, {"DOCKER_CONFIG": str(config.parent)})
    assert code == 4 and envelope["failure"]["category"] == "image_unavailable"
    assert (
        f"{private.host} asked for credentials, and none were found for it in {config} (no "
        "such file)" in envelope["failure"]["reason"]
    )
    assert (
        f"fix: log in to {private.host} (`docker login {private.host}`"
        in (envelope["failure"]["reason"])
    )


# --------------------------------------------------------------------------- no engine


def test_resolution_order_and_sources(tmp_path: Path) -> None:
    """credHelpers before credsStore before auths, as the docker CLI; Docker Hub's helper and
    auths keyed by its index URL; a `<token>` user is an identity token."""
    bin_dir = tmp_path / "bin"
    make_helper(bin_dir, "a", {"reg.example:5000": ["ua", "secret-a"]})
    make_helper(
        bin_dir,
        "b",
        {
            "reg.example:5000": ["ub", "pb"],
            "other.example": ["<token>", "refresh-me"],
            "https://index.docker.io/v1/": ["hub", "hp"],
        },
    )
    blob = base64.b64encode(b"uc:pc").decode()
    config = _config(
        tmp_path / "docker",
        {
            "credHelpers": {"reg.example:5000": "a"},
            "credsStore": "b",
            "auths": {"https://only-auths.example": {"auth": blob}, "reg.example:5000": {}},
        },
    )
    saved = os.environ["PATH"]
    os.environ["PATH"] = _path_with(bin_dir)
    try:
        found = {
            name: registry.find_credentials(name, config)
            for name in ("reg.example:5000", "other.example", "docker.io", "only-auths.example")
        }
        missing = registry.find_credentials("nowhere.example", config)
    finally:
        os.environ["PATH"] = saved
    a, searched = found["reg.example:5000"]
    assert a is not None and (a.username, a.password) == ("ua", "secret-a")
    assert a.source == f"docker-credential-a (credHelpers in {config})"
    assert a.engine_auth("reg.example:5000") == {
        "username": "ua",
        "password": "secret-a",
        "serveraddress": "reg.example:5000",
    }
    assert searched == f"docker-credential-a (credHelpers in {config}), then the auths of {config}"
    token, _ = found["other.example"]
    assert token is not None and token.identity_token == "refresh-me"  # noqa: S105
    assert registry.auth_of(token) is None
    assert token.engine_auth("other.example")["identitytoken"] == "refresh-me"
    hub, _ = found["docker.io"]
    assert hub is not None and (hub.username, hub.source) == (
        "hub",
        f"docker-credential-b (credsStore in {config})",
    )
    auths, _ = found["only-auths.example"]
    assert auths is not None and (auths.username, auths.password) == ("uc", "pc")
    assert auths.source == f"the auths of {config}"
    assert missing == (
        None,
        f"docker-credential-b (credsStore in {config}), then the auths of {config}",
    )
    assert "secret-a" not in repr(a) and "***" in repr(a)


def test_unreadable_configs_and_bad_helpers_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ImageUnavailable, match=f"docker config {bad} is not JSON"):
        registry.find_credentials("reg.example", bad)
    bad.write_text(json.dumps({"auths": {"reg.example": {"auth": "!!!"}}}))
    with pytest.raises(ImageUnavailable, match="has an entry that cannot be read"):
        registry.find_credentials("reg.example", bad)
    # A helper answering with something other than the protocol's JSON.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    liar = bin_dir / "docker-credential-liar"
    liar.write_text('#!/bin/sh\necho \'{"Secret": "x"}\'\n')
    liar.chmod(0o700)
    bad.write_text(json.dumps({"credsStore": "liar"}))
    saved = os.environ["PATH"]
    os.environ["PATH"] = _path_with(bin_dir)
    try:
        with pytest.raises(ImageUnavailable, match="not the JSON of the credential helper"):
            registry.find_credentials("reg.example", bad)
    finally:
        os.environ["PATH"] = saved
    assert registry.find_credentials("reg.example", tmp_path / "none.json") == (
        None,
        f"{tmp_path / 'none.json'} (no such file)",
    )


class _TokenRegistry(http.server.BaseHTTPRequestHandler):
    """A registry whose token realm takes an OAuth2 refresh token (an identity token)."""

    realm = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        if self.headers.get("Authorization") == "Bearer access-ok":
            self._reply(200)
        else:
            challenge = f'Bearer realm="{self.realm}",service="svc",scope="repository:r:pull"'
            body = json.dumps({"errors": [{"code": "UNAUTHORIZED", "message": "no"}]}).encode()
            self._reply(401, body, {"WWW-Authenticate": challenge})

    do_GET = do_HEAD

    def do_POST(self) -> None:
        form = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        fields = dict(pair.split("=", 1) for pair in form.split("&"))
        good = fields.get("grant_type") == "refresh_token" and fields.get("refresh_token") == (
            "refresh-ok"
        )
        if good and fields.get("service") == "svc":
            self._reply(200, json.dumps({"access_token": "access-ok"}).encode())
        else:
            self._reply(401)


def test_identity_tokens_take_the_refresh_token_grant() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TokenRegistry)
    host = f"127.0.0.1:{server.server_address[1]}"
    _TokenRegistry.realm = f"http://{host}/token"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        ref = registry.parse_reference(f"{host}/r", "sha256:" + "1" * 64)
        good = registry.Credentials("<token>", "", "a helper", "refresh-ok")
        registry.probe_once(ref, good, insecure=True, timeout=5)
        bad = registry.Credentials("<token>", "", "a helper", "refresh-bad")
        with pytest.raises(ImageUnavailable, match="refused the credentials from a helper"):
            registry.probe_once(ref, bad, insecure=True, timeout=5)
    finally:
        server.shutdown()
