"""The sixth hostile review (the changes of the start-up, clock, parse and fetch work): what it
found, kept closed. Pure logic only: a hostile engine is a loopback Unix-socket server that
answers ``/_ping`` and ``/version`` as a broken or hostile one could (the real engine cannot be
made to); the cases that need the real engine are in tests/integration."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.backends.docker import DockerBackend
from runner.backends.fake import FakeBackend, FakeJob
from runner.backends.types import ENGINE_TEXT_MAX, EngineInfo
from runner.caches import download
from runner.caches.assets import AssetCache, fetch
from runner.contract.models import Asset
from runner.execution import attempt
from runner.models.envelope import EngineRecord
from runner.parsers import _lines
from runner.parsers._lines import iter_line_batches
from runner.planning.policy import AssetGrant
from runner.state.jobdir import JobDir
from tests.support import run_cli
from tests.support.asset_server import Served, asset_server
from tests.support.clock import VirtualClock
from tests.support.engine_socket import UnixEngine
from tests.unit.test_orchestrator_fake import _contract, _options, _run, _writes

pytestmark = pytest.mark.hostile

# A lone surrogate (JSON can carry one: "\ud800"; UTF-8 cannot), a terminal escape, a newline,
# a non-ASCII letter, and far more than any version is long.
ODD = "\ud800\x1b[2J27.3\n\u00e9" + "9" * 10_000


def _printable_and_short(text: str) -> bool:
    return len(text) <= ENGINE_TEXT_MAX and all(" " <= c <= "~" for c in text)


# ------------------------------------------------------------------ the engine's word


class _HostileEngine(UnixEngine):
    """An Engine API on a Unix socket: ``/_ping`` and ``/version`` (``answer`` as its JSON)."""

    def __init__(self, path: Path, answer: object) -> None:
        self.body = json.dumps(answer).encode()  # ensure_ascii: "\ud800" travels as JSON can
        super().__init__(path)

    def answer(self, conn: socket.socket, line: bytes) -> None:
        body = b"OK" if b"/_ping" in line else self.body
        head = (
            "HTTP/1.1 200 OK\r\nAPI-Version: 1.45\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        conn.sendall(head.encode() + body)


@pytest.fixture
def hostile_engine(short_dir: Path) -> Iterator[_HostileEngine]:
    engine = _HostileEngine(
        short_dir / "engine.sock", {"Version": ODD, "ApiVersion": ODD, "Arch": "x86_64\x00"}
    )
    try:
        yield engine
    finally:
        engine.close()


def test_an_engines_odd_version_is_recorded_printable_and_short(
    hostile_engine: _HostileEngine,
) -> None:
    """An engine's /version strings (a lone surrogate, escapes, 10 kB) once reached the
    envelope as they were: the envelope's JSON could not be written (UTF-8 has no surrogate),
    so every run failed as a runner bug. What is kept is printable ASCII, at most 128 long."""
    backend = DockerBackend(base_url=f"unix://{hostile_engine.path}", timeout=5)
    record = attempt.engine_record(backend)
    assert record.name == "docker"
    assert _printable_and_short(record.version) and _printable_and_short(record.apiVersion)
    assert record.version.startswith("??[2J27.3??9")
    json.loads(record.model_dump_json())  # writable as JSON, and read back
    assert backend.architecture() == "x86_64?"


def test_an_engine_that_answers_no_strings_is_recorded_as_empty(short_dir: Path) -> None:
    engine = _HostileEngine(
        short_dir / "engine.sock", {"Version": {"nested": [1]}, "ApiVersion": 1.45, "Arch": None}
    )
    try:
        backend = DockerBackend(base_url=f"unix://{engine.path}", timeout=5)
        assert attempt.engine_record(backend).model_dump() == {
            "name": "docker", "version": "", "apiVersion": ""
        }  # fmt: skip
    finally:
        engine.close()


def test_runner_version_prints_no_escape_an_engine_sends(hostile_engine: _HostileEngine) -> None:
    """`runner --version` shows the engine's version on the caller's terminal: not its escape
    sequences, nor 10 kB of it."""
    proc = run_cli("--version", env={"DOCKER_HOST": f"unix://{hostile_engine.path}"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\ud800" not in proc.stdout
    line = proc.stdout.strip()
    assert "\n" not in line and len(line) < 600, line
    assert "engine ??[2J27.3??9" in line
    as_json = run_cli(
        "--version", "--json", env={"DOCKER_HOST": f"unix://{hostile_engine.path}"}, timeout=60
    )
    assert as_json.returncode == 0, as_json.stderr
    engine = json.loads(as_json.stdout)["engine"]
    assert _printable_and_short(engine["version"]) and _printable_and_short(engine["apiVersion"])


def test_a_run_on_an_engine_with_an_odd_version_still_writes_its_envelope(
    tmp_path: Path, virtual_clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a backend's engine() says (here the fake's, as a hostile engine would), the run
    ends with its envelope; it once failed `infrastructure` ("a runner bug") at the stage."""
    fake = FakeBackend(jobs=FakeJob(work=_writes()))
    info = fake.add_image()
    monkeypatch.setattr(fake, "engine", lambda: EngineInfo("docker", ODD, "1.45\x1b"))
    env = _run(_contract(tmp_path, info), _options(tmp_path), fake)
    assert env["status"] == "succeeded", env["failure"]
    assert _printable_and_short(env["engine"]["version"])
    assert env["engine"]["apiVersion"] == "1.45?"
    written = json.loads(JobDir(Path(env["jobDir"])).envelope.read_text())
    assert written["engine"] == env["engine"]


@pytest.mark.parametrize(
    "recorded",
    [
        {"name": "docker", "version": "27.3\x1b[2J", "apiVersion": "1.45"},
        {"name": "docker", "version": "\ud800", "apiVersion": "1.45"},
        {"name": "docker", "version": "9" * (ENGINE_TEXT_MAX + 1), "apiVersion": "1.45"},
        {"name": "docker", "version": 27, "apiVersion": "1.45"},
        "docker 27.3",
    ],
)
def test_an_odd_engine_in_the_ledger_is_not_carried_into_the_envelope(recorded: Any) -> None:
    """A reattach takes the engine from the attempt's ledger event: one no runner writes (not
    printable ASCII, too long, not a string) is replaced by the engine reattached through."""
    fake = FakeBackend()
    got = attempt._engine_of({"engine": recorded}, fake)
    assert got == EngineRecord(name="fake", version="0", apiVersion="1.41")


def test_an_engine_a_runner_recorded_is_kept_on_reattach() -> None:
    recorded = {"name": "podman", "version": "5.2.0", "apiVersion": "1.41"}
    assert attempt._engine_of({"engine": recorded}, FakeBackend()).model_dump() == recorded


# ------------------------------------------------------------------ regex.scalar's literal


def test_a_contracts_long_literal_costs_linear_time(tmp_path: Path) -> None:
    """The byte a literal is sought by was chosen over each byte's first place, found once per
    byte of the literal: quadratic in its length, about 50 s of the runner's CPU for the 4 MB
    literal a 4 MiB contract's pattern can hold (12 s for 2 MB). Now at most one search per
    distinct byte (about 0.03 s for 4 MB); the answer is the same."""
    log = tmp_path / "log.txt"
    log.write_bytes(b"value 1\n" * 1000)
    required = b"a" * (2 * 1024 * 1024) + b"b" * (2 * 1024 * 1024)
    started = time.process_time()  # this process's CPU, whatever else the machine runs
    batches = list(iter_line_batches(log, universal=True, required=required, skipped=[]))
    assert time.process_time() - started < 5.0
    assert batches == []  # no line holds the literal: every chunk skipped


def test_a_literal_across_a_chunks_seam_is_still_found(tmp_path: Path) -> None:
    """A literal split by a read's end (``va`` | ``lue=``: the incomplete line carried over,
    then the next read) is found in neither part alone; the seam between them is searched."""
    log = tmp_path / "log.txt"
    body = b"x" * (_lines.CHUNK_BYTES - 3) + b"\nvalue=42 done\n" + b"x\n" * 10
    log.write_bytes(body)
    lines = [
        line
        for _, batch in iter_line_batches(log, universal=True, required=b"value=", skipped=[])
        for line in batch
    ]
    assert "value=42 done" in lines


# ------------------------------------------------------------------ job status, queued


def test_job_status_of_a_folder_is_not_taken_for_a_job_another_state_dir_submitted(
    tmp_path: Path,
) -> None:
    """`runner job status FOLDER` of a folder with no ledger (a refused job) once looked for a
    cluster submission under --state-dir, not the folder's own, and showed a job of the same
    id submitted from there as this one, queued. It is the refusal, as before."""
    folder = tmp_path / "elsewhere" / "jobs" / "shared-id"
    (folder / "record").mkdir(parents=True)
    other = tmp_path / "state"
    (other / "kubernetes" / "shared-id").mkdir(parents=True)
    entry = {"to": "kubernetes", "jobId": "shared-id", "name": "runner-shared-id"}
    (other / "kubernetes" / "shared-id" / "submissions.jsonl").write_text(json.dumps(entry) + "\n")
    proc = run_cli("job", "status", str(folder), "--state-dir", str(other), "--json", timeout=60)
    assert proc.returncode != 0, proc.stdout
    assert "never got past its refusal" in proc.stderr
    assert "submitted" not in proc.stdout
    # The same id, not found as a folder, is the submission under that state dir.
    queued = run_cli("job", "status", "shared-id", "--state-dir", str(other), "--json", timeout=60)
    assert queued.returncode == 0, queued.stderr
    info = json.loads(queued.stdout)
    assert info["kubernetes"]["name"] == "runner-shared-id" and info["slurm"] is None


# ------------------------------------------------------------------ an asset's decoded body


def test_a_compressed_body_is_decoded_a_read_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that sends Content-Encoding gzip although asked for identity: 64 MiB of zeros
    in 64 kB. urllib3's read1 decodes at most ``READ_CHUNK`` a read (its max_length), so the
    runner never holds more than that of it at once; the digest is of the decoded bytes."""
    plain_size = 64 * 1024 * 1024
    body = gzip.compress(b"\0" * plain_size, 9)
    digest = hashlib.sha256(b"\0" * plain_size).hexdigest()
    sizes: list[int] = []
    original = download._body

    def spied(resp: Any) -> Iterator[bytes]:
        for chunk in original(resp):
            sizes.append(len(chunk))
            yield chunk

    with asset_server() as server:
        server.files["z"] = Served(body, headers={"Content-Encoding": "gzip"}, chunk=1 << 20)
        asset = Asset.model_validate(
            {"id": "data", "sources": [server.url("z")], "size": plain_size,
             "path": "zeros.bin", "sha256": "sha256:" + digest}
        )  # fmt: skip
        monkeypatch.setattr(download, "_body", spied)
        got = fetch(asset, tmp_path, AssetCache(tmp_path / "c"),
                    AssetGrant(allowHosts=["127.0.0.1"], retries=0))  # fmt: skip
    assert got.source == server.url("z")
    assert sum(sizes) == plain_size and max(sizes) <= download.READ_CHUNK


def test_an_engines_odd_image_answer_is_kept_only_as_far_as_it_can_be_compared_and_recorded(
    short_dir: Path,
) -> None:
    """`inspect_image` of an engine that answers odd strings (a lone surrogate, escapes, a
    newline), a size that is not a number and no id: the names no reference can hold are
    dropped, the platform is printable, the size 0, an environment entry UTF-8 cannot hold
    dropped, and no crash: the image record (and the envelope it goes into) stays writable."""
    from runner.backends.docker import DockerBackend

    good_digest = "registry.example/toy@sha256:" + "a" * 64
    engine = _HostileEngine(
        short_dir / "engine.sock",
        {
            "RepoDigests": [ODD, good_digest, 7, "x" * 2000],
            "RepoTags": ["toy:1\x1b[2J", "toy:2"],
            "Architecture": ODD,
            "Os": "linux\n",
            "Size": "a lot",
            "Config": {"Env": ["A=\ud800", "PATH=/usr/bin", 3]},
        },
    )
    try:
        info = DockerBackend(f"unix://{engine.path}").inspect_image("toy:2")
    finally:
        engine.close()
    assert info is not None
    assert info.id == ""  # no id: it matches no pin
    assert info.repo_digests == (good_digest,) and info.repo_tags == ("toy:2",)
    assert _printable_and_short(info.architecture) and info.os == "linux?"
    assert info.size == 0
    assert info.env == ("PATH=/usr/bin",)
    json.dumps(info.__dict__, ensure_ascii=False).encode()  # UTF-8 holds every field


def test_an_engine_answer_past_the_cap_is_refused_not_read_on(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine (or whatever DOCKER_HOST names) that answers an inspect with more than the
    cap: refused as the engine's failure, having read no more than the cap and a byte."""
    from runner.backends import docker as engine_api
    from runner.backends import transport
    from runner.core.errors import EngineUnavailable

    monkeypatch.setattr(transport, "MAX_ANSWER_BYTES", 1024 * 1024)
    engine = _HostileEngine(short_dir / "engine.sock", {"Id": "x", "pad": "a" * (2 << 20)})
    try:
        with pytest.raises(EngineUnavailable, match="more than 1,048,576 bytes"):
            engine_api.DockerBackend(f"unix://{engine.path}").inspect_image("toy:1")
    finally:
        engine.close()


@pytest.mark.hostile
def test_an_engine_that_trickles_its_answer_is_cut_off_at_the_calls_limit(
    short_dir: Path,
) -> None:
    """An answer sent a byte every 50 ms, each receive well within the call's 0.5 s timeout,
    used to hold the call as long as the engine liked (a watch loop held in one call cannot
    stop a job at its budget's end); now the whole answer must come within the 0.5 s."""
    from runner.backends import docker as engine_api
    from runner.core.errors import EngineUnavailable

    path = short_dir / "trickle.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    stop = threading.Event()

    def trickle() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                if b"/_ping" in conn.recv(65536).split(b"\r\n", 1)[0]:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nAPI-Version: 1.41\r\n"
                                 b"Content-Length: 2\r\n\r\nOK")  # fmt: skip
                    continue
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
                for _ in range(800):  # 40 s of it at most, then the connection ends
                    if stop.wait(0.05):
                        break
                    conn.sendall(b" ")

    threading.Thread(target=trickle, daemon=True).start()
    try:
        backend = engine_api.DockerBackend(f"unix://{path}", timeout=0.5)
        began = time.monotonic()
        with pytest.raises(EngineUnavailable, match="TimeoutError"):
            backend.inspect_image("toy:1")
        # Cut at 0.5 s; before, the inspect went on as long as the engine trickled (here 40
        # s, then an incomplete answer). A loaded machine may add seconds, not 30.
        assert time.monotonic() - began < 30
    finally:
        stop.set()
        server.close()
