"""Hostile asset archives (issue 16): the bytes match the contract's digest, but the archive is
made to escape, plant links or devices, or unpack without end. Each is refused with the member
named, and nothing is left in the cache's trees/ (nor outside the cache)."""

from __future__ import annotations

import hashlib
import io
import stat
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from runner import archives
from runner.assets import AssetCache, fetch
from runner.contract.models import Asset
from runner.errors import AssetUnavailable
from runner.policy import AssetGrant

pytestmark = pytest.mark.hostile


def _tar(add: Callable[[tarfile.TarFile], None], mode: str = "w") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:  # type: ignore[call-overload]
        add(tar)
    return buf.getvalue()


def _member(tar: tarfile.TarFile, name: str, data: bytes = b"x", **attrs: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in attrs.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if info.isreg() else None)


def _members(tar: tarfile.TarFile, names: list[str]) -> None:
    for name in names:
        _member(tar, name)


def _special(name: str, kind: bytes, linkname: str = "") -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        _member(tar, "ok.txt")
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = linkname
        info.devmajor, info.devminor = 1, 3
        tar.addfile(info)

    return add


def _zip(entries: list[tuple[str, bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return buf.getvalue()


def _lying_zip() -> bytes:
    """A zip whose header says 10 bytes and whose data inflates to 10 MiB."""
    data = _zip([("bomb.bin", b"\0" * (10 * 1024 * 1024), 0o100644)])
    raw = bytearray(data)
    # Patch the declared uncompressed size (local header at 22, central directory at 24).
    local = raw.find(b"PK\x03\x04")
    raw[local + 22 : local + 26] = (10).to_bytes(4, "little")
    central = raw.find(b"PK\x01\x02")
    raw[central + 24 : central + 28] = (10).to_bytes(4, "little")
    return bytes(raw)


HOSTILE_TARS: dict[str, tuple[bytes, str]] = {
    "dotdot": (_tar(lambda t: _member(t, "../escaped.txt")), "climbs out with '..'"),
    "dotdot-inside": (_tar(lambda t: _member(t, "a/../../escaped.txt")), "climbs out"),
    "absolute": (_tar(lambda t: _member(t, "/tmp/escaped.txt")), "absolute path"),
    "symlink-out": (_tar(_special("link", tarfile.SYMTYPE, "/etc/passwd")), "is a link"),
    "symlink-in": (_tar(_special("link", tarfile.SYMTYPE, "ok.txt")), "is a link"),
    "hardlink": (_tar(_special("hard", tarfile.LNKTYPE, "/etc/passwd")), "is a link"),
    "char-device": (_tar(_special("null", tarfile.CHRTYPE)), "device, FIFO"),
    "block-device": (_tar(_special("disk", tarfile.BLKTYPE)), "device, FIFO"),
    "fifo": (_tar(_special("pipe", tarfile.FIFOTYPE)), "device, FIFO"),
    "twice": (_tar(lambda t: _members(t, ["a.txt", "./a.txt"])), "appears twice"),
    "bomb": (
        _tar(lambda t: _member(t, "big.bin", b"\0" * (2 * 1024 * 1024)), "w:gz"),
        "more than 1,048,576 bytes",
    ),
    "too-many-files": (
        _tar(lambda t: _members(t, [f"f{i}" for i in range(20)])),
        "more than 10 files",
    ),
    "not-a-tar": (b"this is not an archive at all" * 100, "not a readable tar"),
}

HOSTILE_ZIPS: dict[str, tuple[bytes, str]] = {
    "dotdot": (_zip([("../escaped.txt", b"x", 0o100644)]), "climbs out"),
    "absolute": (_zip([("/tmp/escaped.txt", b"x", 0o100644)]), "absolute path"),
    "backslash": (_zip([("..\\escaped.txt", b"x", 0o100644)]), "backslash"),
    "symlink": (_zip([("link", b"/etc/passwd", stat.S_IFLNK | 0o777)]), "is a link"),
    "fifo": (_zip([("pipe", b"", stat.S_IFIFO | 0o644)]), "device, FIFO"),
    "bomb": (_zip([("bomb.bin", b"\0" * (2 * 1024 * 1024), 0o100644)]), "more than 1,048,576"),
    # zipfile reads no more than the header's size; the checksum of those bytes then fails.
    "lying-bomb": (_lying_zip(), "Bad CRC-32"),
    "too-many-files": (_zip([(f"f{i}", b"", 0o100644) for i in range(20)]), "more than 10"),
}

GRANT = AssetGrant(maxUnpackedBytes=1024 * 1024, maxUnpackedFiles=10)


def _fetch(tmp_path: Path, data: bytes, kind: str) -> AssetCache:
    (tmp_path / "archive").write_bytes(data)
    asset = Asset.model_validate(
        {"id": "hostile", "sources": ["archive"], "size": len(data), "path": "tree",
         "sha256": "sha256:" + hashlib.sha256(data).hexdigest(), "unpack": kind}
    )  # fmt: skip
    cache = AssetCache.of_state(tmp_path / "state")
    fetch(asset, tmp_path, cache, GRANT)
    return cache


@pytest.mark.parametrize("case", sorted(HOSTILE_TARS))
def test_a_hostile_tar_is_refused_and_leaves_nothing(tmp_path: Path, case: str) -> None:
    data, said = HOSTILE_TARS[case]
    with pytest.raises(AssetUnavailable, match="tar archive is refused") as err:
        _fetch(tmp_path, data, "tar")
    assert said in str(err.value)
    assert err.value.retryable is False
    trees = tmp_path / "state" / "cache" / "assets" / "trees"
    assert list(trees.iterdir()) == []
    assert not (tmp_path / "escaped.txt").exists()
    assert not Path("/tmp/escaped.txt").exists()


@pytest.mark.parametrize("case", sorted(HOSTILE_ZIPS))
def test_a_hostile_zip_is_refused_and_leaves_nothing(tmp_path: Path, case: str) -> None:
    data, said = HOSTILE_ZIPS[case]
    with pytest.raises(AssetUnavailable, match="zip archive is refused") as err:
        _fetch(tmp_path, data, "zip")
    assert said in str(err.value)
    trees = tmp_path / "state" / "cache" / "assets" / "trees"
    assert list(trees.iterdir()) == []
    assert not (tmp_path / "escaped.txt").exists()


def test_a_clean_archive_unpacks_read_only(tmp_path: Path) -> None:
    """Folders 0555, files 0444, contents intact; for tar and zip alike."""

    def add(t: tarfile.TarFile) -> None:
        _member(t, "d/", b"", type=tarfile.DIRTYPE)
        _member(t, "d/a.txt", b"hello")

    tar = _tar(add, "w:gz")
    (tmp_path / "t").mkdir()
    cache = _fetch(tmp_path / "t", tar, "tar")
    tree = cache.tree(hashlib.sha256(tar).hexdigest(), "tar")
    assert (tree / "d" / "a.txt").read_bytes() == b"hello"
    assert stat.S_IMODE((tree / "d" / "a.txt").stat().st_mode) == 0o444
    assert stat.S_IMODE((tree / "d").stat().st_mode) == 0o555
    archives.remove_tree(tree)
    assert not tree.exists()
    z = _zip([("x/b.txt", b"world", 0o100644)])
    (tmp_path / "z").mkdir()
    cache = _fetch(tmp_path / "z", z, "zip")
    ztree = cache.tree(hashlib.sha256(z).hexdigest(), "zip")
    assert (ztree / "x" / "b.txt").read_bytes() == b"world"
