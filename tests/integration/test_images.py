"""Pinned images: pulled by digest from a real registry on loopback, verified, retried only
when it helps; offline bundles. Real engine, Debian's docker-registry."""

from __future__ import annotations

import http.client
import http.server
import json
import shutil
import socket
import subprocess
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from runner.images import pins as images
from runner.images import registry
from runner.testing import TOY
from tests.support import docker, run_job, write_contract

pytestmark = pytest.mark.docker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def local_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Debian's docker-registry on 127.0.0.1, with its own storage; stopped afterwards."""
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.fail("docker-registry is not installed: run scripts/setup.sh")
    root = tmp_path_factory.mktemp("registry")
    port = _free_port()
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        "  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    log = (root / "registry.log").open("wb")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"docker-registry did not start: {(root / 'registry.log').read_text()}")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def _build_unique(image_id: str) -> str:
    """A small image on top of runner-cpu:local with its own id; returns its local tag."""
    tag = f"runner-test/unique:{uuid.uuid4().hex[:12]}"
    dockerfile = f"FROM {image_id}\nLABEL org.runner.test={uuid.uuid4().hex}\n"
    proc = subprocess.run(
        ["docker", "build", "-q", "--network", "none", "-t", tag, "-"],
        input=dockerfile,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return tag


def _inspect(ref: str) -> dict[str, Any]:
    out = docker("image", "inspect", ref)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout)[0])


@pytest.fixture
def pushed(local_registry: str, image_id: str) -> Iterator[tuple[str, str, str]]:
    """A unique image pushed to the loopback registry and then removed locally:
    (repository, manifest digest, image id)."""
    tag = _build_unique(image_id)
    unique_id = _inspect(tag)["Id"]
    repo = f"{local_registry}/runner/toy"
    remote = f"{repo}:{tag.rsplit(':', 1)[1]}"
    assert docker("tag", tag, remote).returncode == 0
    push = docker("push", remote)
    assert push.returncode == 0, push.stderr
    digests = [d for d in _inspect(remote)["RepoDigests"] if d.startswith(repo + "@")]
    digest = digests[0].split("@", 1)[1]
    assert docker("rmi", "-f", unique_id).returncode == 0
    assert docker("image", "inspect", unique_id).returncode != 0
    yield repo, digest, unique_id
    docker("rmi", "-f", unique_id)


def test_pull_by_digest_then_run(
    tmp_path: Path, pushed: tuple[str, str, str], local_registry: str
) -> None:
    """An image absent locally is pulled by digest, verified, and run; credentials from the
    docker config never reach the output."""
    repo, digest, unique_id = pushed
    config_dir = tmp_path / "docker-config"
    config_dir.mkdir()
    (config_dir / "config.json").write_text(
        json.dumps(
            {"auths": {local_registry: {"auth": "dGVzdHVzZXI6czNjcmV0LXB3"}}}  # testuser:s3cret-pw
        )
    )
    contract = write_contract(tmp_path, f"{repo}@{digest}", environment={"imageId": unique_id})
    code, env, stderr = run_job(
        contract, tmp_path / "state", env={"DOCKER_CONFIG": str(config_dir)}
    )
    assert code == 0, (env, stderr)
    assert env["measurements"][0]["value"] == 0.819
    image = env["image"]
    assert image["source"] == "pulled"
    assert image["id"] == unique_id
    assert image["repoDigest"] == f"{repo}@{digest}"
    assert image["architecture"] == "amd64" and image["sizeBytes"] > 0
    everything = (
        json.dumps(env) + stderr + (Path(env["jobDir"]) / "record" / "ledger.jsonl").read_text()
    )
    assert "s3cret-pw" not in everything and "dGVzdHVzZXI6czNjcmV0LXB3" not in everything

    # Present now: the second job uses it without asking the registry.
    code, again, _ = run_job(contract, tmp_path / "state2")
    assert code == 0 and again["image"]["source"] == "local"


def test_unknown_digest_is_unavailable_without_retries(
    tmp_path: Path, local_registry: str, image_id: str
) -> None:
    missing = "sha256:" + "e" * 64
    contract = write_contract(tmp_path, f"{local_registry}/runner/toy@{missing}")
    t0 = time.monotonic()
    code, env, _ = run_job(contract, tmp_path / "state")
    assert time.monotonic() - t0 < 15
    assert code == 4
    assert env["failure"]["category"] == "image_unavailable"
    assert "does not have that manifest" in env["failure"]["reason"]
    assert "MANIFEST_UNKNOWN" in env["failure"]["reason"]
    assert env["container"] is None


class _Flaky(http.server.BaseHTTPRequestHandler):
    """Forwards to the registry, after answering 503 to the first `fail` requests."""

    upstream = ""
    fail = 2
    seen = 0
    lock = threading.Lock()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _forward(self) -> None:
        with _Flaky.lock:
            _Flaky.seen += 1
            failing = _Flaky.seen <= _Flaky.fail
        if failing:
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        host, port = self.upstream.split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        self.send_response(resp.status)
        for key, value in resp.getheaders():
            if key.lower() not in {"transfer-encoding", "connection", "content-length"}:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        conn.close()

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = _forward


def test_transient_503_is_retried(
    tmp_path: Path, pushed: tuple[str, str, str], local_registry: str
) -> None:
    """A registry answering 503 twice, then fine, is retried with backoff and pulled."""
    repo, digest, unique_id = pushed
    _Flaky.upstream, _Flaky.seen = local_registry, 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        proxy = f"127.0.0.1:{server.server_address[1]}"
        name = repo.replace(local_registry, proxy)
        contract = write_contract(tmp_path, f"{name}@{digest}", environment={"imageId": unique_id})
        code, env, stderr = run_job(contract, tmp_path / "state")
    finally:
        server.shutdown()
        docker("rmi", "-f", f"{name}@{digest}")
    assert code == 0, (env, stderr)
    assert env["image"]["source"] == "pulled"
    assert "answered after 3 tries" in stderr


def test_pulled_image_with_another_id_is_refused(
    tmp_path: Path, pushed: tuple[str, str, str], image_id: str
) -> None:
    repo, digest, _ = pushed
    contract = write_contract(tmp_path, f"{repo}@{digest}", environment={"imageId": image_id})
    code, env, _ = run_job(contract, tmp_path / "state")
    assert code == 3
    assert env["failure"]["category"] == "image_digest_mismatch"
    assert env["container"] is None


def test_offline_bundle_loads_and_runs(tmp_path: Path, image_id: str) -> None:
    """A `docker save` bundle holding the pinned image id is loaded and run; a bundle holding
    another image is refused before anything is loaded."""
    tag = _build_unique(image_id)
    unique_id = _inspect(tag)["Id"]
    other_tag = _build_unique(image_id)
    other_id = _inspect(other_tag)["Id"]
    bundle, other = tmp_path / "bundle.tar", tmp_path / "other.tar"
    assert docker("save", "-o", str(bundle), tag).returncode == 0
    assert docker("save", "-o", str(other), other_tag).returncode == 0
    assert images.bundle_image_ids(bundle) == [unique_id]
    docker("rmi", "-f", unique_id, other_id)
    try:
        contract = write_contract(tmp_path, unique_id)
        code, env, _ = run_job(contract, tmp_path / "wrong", "--bundle", str(other))
        assert code == 3 and env["failure"]["category"] == "image_digest_mismatch"
        assert docker("image", "inspect", other_id).returncode != 0, "nothing was loaded"

        code, env, stderr = run_job(contract, tmp_path / "state", "--bundle", str(bundle))
        assert code == 0, (env, stderr)
        assert env["image"]["source"] == "bundle" and env["image"]["id"] == unique_id
    finally:
        docker("rmi", "-f", unique_id, other_id)


def test_bundle_ids_are_checked_against_their_config_bytes(tmp_path: Path) -> None:
    """The id of a bundle entry is the SHA-256 of its config, computed, not read from a name."""
    config = b'{"architecture":"amd64","os":"linux"}'
    bundle = tmp_path / "b.tar"
    with tarfile.open(bundle, "w") as tar:
        for name, data in (
            ("manifest.json", json.dumps([{"Config": "cfg.json", "Layers": []}]).encode()),
            ("cfg.json", config),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, __import__("io").BytesIO(data))
    import hashlib

    assert images.bundle_image_ids(bundle) == ["sha256:" + hashlib.sha256(config).hexdigest()]
    (tmp_path / "not.tar").write_bytes(b"nope")
    with pytest.raises(images.ImageUnavailable, match="not a readable"):
        images.bundle_image_ids(tmp_path / "not.tar")


@pytest.mark.parametrize(
    ("name", "registry_host", "repository", "pull"),
    [
        ("python", "docker.io", "library/python", "python@D"),
        ("lab/eval", "docker.io", "lab/eval", "lab/eval@D"),
        ("localhost:5000/lab/eval", "localhost:5000", "lab/eval", "localhost:5000/lab/eval@D"),
        ("ghcr.io/org/img", "ghcr.io", "org/img", "ghcr.io/org/img@D"),
    ],
)
def test_references_split_like_the_engine(
    name: str, registry_host: str, repository: str, pull: str
) -> None:
    ref = registry.parse_reference(name, "D")
    assert (ref.registry, ref.repository, ref.pull_name) == (registry_host, repository, pull)


def test_loopback_registries_are_plain_http() -> None:
    assert registry.is_insecure("127.0.0.1:5000") and registry.is_insecure("localhost:5000")
    assert not registry.is_insecure("ghcr.io")
    assert registry.is_insecure("lab.internal:5000", ("lab.internal:5000",))


def test_credentials_come_from_the_docker_config(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"auths": {"https://ghcr.io": {"auth": "dTpw"}}}))  # u:p
    creds = registry.credentials_for("ghcr.io", config)
    assert creds is not None and (creds.username, creds.password) == ("u", "p")
    assert "p'" not in repr(creds) and "***" in repr(creds)
    assert registry.credentials_for("other.io", config) is None


def test_the_kubernetes_quickstart_runs_as_the_manual_writes_it(
    tmp_path: Path, local_registry: str, image_id: str
) -> None:
    """docs/how-to/kubernetes.md, command by command: the image pushed to a registry and
    pinned by the pushed name (its manifest digest), signed, staged and submitted to a
    (stand-in) cluster, which gets a Job pulling name@sha256:<digest>. The toy quickstart's
    own pin (runner-cpu:local, a local image id) is refused at submit, naming the field and
    the fix (the manual's quickstart once failed so, as written)."""
    from tests.support import run_cli
    from tests.support.kubeapi import api_server, write_kubeconfig

    work = tmp_path / "toy"
    shutil.copytree(TOY, work)
    remote = f"{local_registry}/runner-cpu:{uuid.uuid4().hex[:8]}"
    assert docker("tag", "runner-cpu:local", remote).returncode == 0
    try:
        push = docker("push", remote)
        assert push.returncode == 0, push.stderr
        keys = tmp_path / "keys"
        keys.mkdir()
        assert run_cli("key", "new", "--out", str(keys / "issuer")).returncode == 0
        trusted = tmp_path / "trusted"
        trusted.mkdir()
        shutil.copy(keys / "issuer.pub", trusted / "issuer.pub")
        state = tmp_path / "state"
        trust = ["--trusted-keys", str(trusted), "--state-dir", str(state)]
        with api_server() as server:
            kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", {"lab": server}, "lab")
            k8s = ["--to", "kubernetes", "--namespace", "repro", "--context", "lab",
                   "--kubeconfig", str(kubeconfig), *trust]  # fmt: skip
            for image, pinned in (("runner-cpu:local", "local"), (remote, "pushed")):
                out = work / f"task.{pinned}.json"
                pin = run_cli("contract", "pin", str(work / "task.json"), "--image", image,
                              "-o", str(out))  # fmt: skip
                assert pin.returncode == 0, pin.stderr
                sign = run_cli("contract", "sign", str(out), "--key", str(keys / "issuer.key"))
                assert sign.returncode == 0, sign.stderr
            local, pushed = work / "task.local.dsse.json", work / "task.pushed.dsse.json"
            refused = run_cli("cluster", "submit", str(local), *k8s)
            assert refused.returncode == 3, refused.stderr
            assert "$.environment.image" in refused.stderr and "push the image" in refused.stderr
            assert server.writes() == []
            staged = run_cli("cluster", "stage", str(pushed), *trust, "--json")
            assert staged.returncode == 0, staged.stderr
            sub = run_cli("cluster", "submit", str(pushed), *k8s, "--json")
            assert sub.returncode == 0, sub.stderr
            (got,) = json.loads(sub.stdout)
            jobs = [o for (kind, _, _), o in server.objects.items() if kind == "Job"]
        pinned_ref = json.loads((work / "task.pushed.json").read_text())["environment"]["image"]
        assert pinned_ref.startswith(remote.rsplit(":", 1)[0] + "@sha256:")
        (job,) = jobs
        images = [c["image"] for c in job["spec"]["template"]["spec"]["containers"]]
        assert images == [pinned_ref], "the nodes pull the pushed manifest digest"
        assert got["name"] == job["metadata"]["name"]
        assert (state / "kubernetes" / got["jobId"] / "submissions.jsonl").is_file()
    finally:
        docker("rmi", remote)  # the tag only: runner-cpu:local stays
