"""The seventh hostile review (the changes since dac56f3, and what they lead to): what it found,
kept closed. Pure logic only: hostile bundles are written here as a hostile exporter could."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from runner.results.bundle.verify import Keys, verify

pytestmark = pytest.mark.hostile


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _bag_fetching(path: Path, size: str) -> Path:
    """An unsealed .tar.gz bag whose fetch.txt stores data/blob.bin beside it, with ``size``
    as its size field (tag manifest and Payload-Oxum as an exporter writes them)."""
    blob = b"zz"
    files = {
        "data/result.json": b"{}",
        "bagit.txt": b"BagIt-Version: 1.0\nTag-File-Character-Encoding: UTF-8\n",
        "bag-info.txt": b"Payload-Oxum: 4.2\nBagging-Date: 2026-12-01\n",
        "manifest-sha256.txt": (
            f"{_sha(b'{}')}  data/result.json\n{_sha(blob)}  data/blob.bin\n".encode()
        ),
        "runner-bundle.json": b'{"kind": "runner.bundle-info"}',
        "fetch.txt": f"file:sha256/{_sha(blob)} {size} data/blob.bin\n".encode(),
    }
    tags = "".join(f"{_sha(data)}  {name}\n" for name, data in files.items() if "/" not in name)
    files["tagmanifest-sha256.txt"] = tags.encode()
    with tarfile.open(path, "w:gz") as tar:
        for folder in ("b", "b/data"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(f"b/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("size", ["\u00b2", "\u0662"], ids=["superscript-two", "arabic-indic-two"])
def test_a_fetch_txt_size_in_non_ascii_digits_is_a_problem_not_a_crash(
    tmp_path: Path, size: str
) -> None:
    """fetch.txt's size field is checked with str.isdigit(), which holds for '²' (int() then
    raised ValueError out of `runner verify bundle`: a traceback, no report) and for '٢'
    (read as 2: a size no exporter writes, accepted). Either is now a fetch.txt problem."""
    archive = _bag_fetching(tmp_path / "b.bag.tar.gz", size)
    report = verify(archive, keys=Keys([], []), allow_untrusted=True)
    payload = next(c for c in report.checks if c.name == "payload")
    assert payload.status == "failed", payload
    assert any(
        p.file == "fetch.txt" and "by its digest and size" in p.message for p in report.problems
    ), report.problems
