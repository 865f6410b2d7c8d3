"""`runner export` and `runner verify-bundle`: a run as one BagIt archive that anyone can
verify offline, with no engine and no docker SDK; one changed byte anywhere fails it, naming
the file.

The tests that need the engine are in tests/integration/test_bundle.py."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.support import run_cli


def _verify(
    archive: Path, *extra: str, env: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    proc = run_cli("verify-bundle", str(archive), "--json", *extra, env=env)
    try:
        report: dict[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"not a JSON report:\n{proc.stdout}\n{proc.stderr}")
    return proc.returncode, report


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _file(name: str) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), b"x"


def _link(name: str, target: str) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info, b""


@pytest.mark.parametrize(
    ("members", "named", "says"),
    [
        ([_file("b/bagit.txt"), _file("b/../../evil")], "b/../../evil", "leaves"),
        ([_file("/etc/evil")], "/etc/evil", "leaves"),
        ([_file("b/bagit.txt"), _link("b/data/x", "/etc/passwd")], "b/data/x", "a link"),
        ([_file("b/bagit.txt"), _file("c/bagit.txt")], "c/bagit.txt", "outside"),
        ([_file("b/bagit.txt"), _file("b/bagit.txt")], "b/bagit.txt", "twice"),
    ],
)
def test_a_hostile_archive_is_refused_before_anything_is_unpacked(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]], named: str, says: str
) -> None:
    archive = _tar(tmp_path / "hostile.tar", members)
    code, report = _verify(archive, "--allow-untrusted")
    assert code == 3 and report["category"] == "bundle_invalid"
    assert report["firstProblem"]["file"] == named and says in report["firstProblem"]["message"]
    assert not (tmp_path.parent / "evil").exists()


def test_not_an_archive(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 100)
    code, report = _verify(junk)
    assert code == 3 and report["firstProblem"]["file"] == "junk.tar"
    assert _verify(tmp_path / "missing.tar")[1]["firstProblem"]["message"] == "does not exist"
