"""A pull that fails midway is tried again only when the registry says that may help (its
manifest HEAD, asked again, fails for now: 5xx or no answer): three tries at most, 2 s then
4 s apart, each retry said on the progress; after the third the registry's error itself. The
registry is a real HTTP server on loopback answering a scripted status; the engine is the
fake (what is under test is the retry logic around its pull)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from runner.backends.fake import FakeBackend
from runner.backends.types import ImageInfo
from runner.core.errors import ImageUnavailable
from runner.images import pins, registry
from tests.support.clock import VirtualClock

DIGEST = "sha256:" + "a" * 64


class _Scripted(http.server.BaseHTTPRequestHandler):
    """Answers each manifest request with the next status of ``script`` (then 200)."""

    script: ClassVar[list[int]] = []
    heads = 0

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        _Scripted.heads += 1
        status = _Scripted.script.pop(0) if _Scripted.script else 200
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


class _Progress:
    def __init__(self) -> None:
        self.stages: list[str] = []

    def stage(self, name: str, detail: str) -> None:
        self.stages.append(detail)

    def transfer(self, label: str, done: int, total: int) -> None:
        pass


@pytest.fixture
def host() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _pull(
    host: str, script: list[int], failures: int, tmp_path: Path
) -> tuple[FakeBackend, _Progress, str]:
    """Pull ``host``/lab/eval@DIGEST, the engine failing its first ``failures`` pulls."""
    _Scripted.script, _Scripted.heads = list(script), 0
    name = f"{host}/lab/eval"
    ref = registry.parse_reference(name, DIGEST).pull_name
    fake = FakeBackend()
    fake.pullable[ref] = ImageInfo("sha256:" + "b" * 64, (), (), "x86_64", "linux", 1)
    pulls = iter(range(failures))
    fake.fail["pull"] = lambda _: (
        ImageUnavailable("pull failed midway (fake engine)")
        if next(pulls, None) is not None
        else None
    )
    config = tmp_path / "config.json"
    config.write_text("{}")
    pin = pins.parse_pin(f"{name}@{DIGEST}", None, allow_unpinned=False)
    progress = _Progress()
    pins._pull(fake, pin, pins.PullSettings(docker_config=config), progress)
    return fake, progress, ref


RETRYING = "failed during the pull; retrying"


def test_a_pull_the_registry_failed_is_tried_again(
    host: str, tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    fake, progress, ref = _pull(host, [200, 503, 503], 2, tmp_path)
    assert [c for c in fake.calls if c[0] == "pull"] == [("pull", ref)] * 3
    assert sum(RETRYING in s for s in progress.stages) == 2
    assert virtual_clock.sleeps == [2, 4]  # 2 s, then 4 s
    assert _Scripted.heads == 3  # the first probe, then one after each failed pull


def test_after_three_tries_the_registrys_error(
    host: str, tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    # As a refusal (image_unavailable, retryable), not the registry module's retry signal
    # (a plain Exception, which crashed the run).
    with pytest.raises(ImageUnavailable, match="answered 503") as exc:
        _pull(host, [200, 503, 503, 503], 3, tmp_path)
    assert exc.value.retryable and isinstance(exc.value.__cause__, registry.TransientRegistryError)
    assert _Scripted.heads == 4
    assert virtual_clock.sleeps == [2, 4]  # none after the third


def test_a_pull_failing_with_the_registry_fine_is_not_tried_again(
    host: str, tmp_path: Path
) -> None:
    with pytest.raises(ImageUnavailable, match="midway"):
        _pull(host, [200, 200], 3, tmp_path)
    assert _Scripted.heads == 2  # no retry: the engine's own error, at once
