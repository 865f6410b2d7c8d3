"""Hostile asset archives (issue 16): the bytes match the contract's digest, but the archive is
made to escape, plant links or devices, or unpack without end. Each is refused with the member
named, and nothing is left in the cache's trees/ (nor outside the cache)."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import subprocess
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runner.caches.assetcache import prune
from runner.caches.assets import AssetCache, fetch
from runner.contract.models import Asset
from runner.core import archives
from runner.core.errors import AssetUnavailable
from runner.planning.policy import AssetGrant
from runner.state.jobdir import StateDir

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
    # 3 files, but 9 folders their names imply: 12 made, more than the 10 allowed
    "implied-folders": (
        _tar(lambda t: _members(t, [f"d{i}/a/b/f" for i in range(3)])),
        "more than 10 files",
    ),
    "too-deep": (_tar(lambda t: _member(t, "a/" * 100 + "f")), "101 parts deep, more than 64"),
    "long-part": (_tar(lambda t: _member(t, "x" * 300)), "longer than 255"),
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
    "implied-folders": (
        _zip([(f"d{i}/a/b/f", b"", 0o100644) for i in range(3)]),
        "more than 10 files",
    ),
    "too-deep": (_zip([("a/" * 100 + "f", b"", 0o100644)]), "more than 64"),
}

GRANT = AssetGrant(maxUnpackedBytes=1024 * 1024, maxUnpackedFiles=10)


def _fetch(tmp_path: Path, data: bytes, kind: str, name: str = "archive") -> AssetCache:
    (tmp_path / name).write_bytes(data)
    asset = Asset.model_validate(
        {"id": "hostile", "sources": [name], "size": len(data), "path": "tree",
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


@pytest.fixture
def deep_tmp(tmp_path: Path) -> Iterator[Path]:
    """tmp_path, emptied with rm -rf afterwards whatever the test left: a tree deeper than
    Python's recursion limit would break pytest's own clean-up of old temporary folders
    (shutil.rmtree recurses on 3.11)."""
    yield tmp_path
    for child in tmp_path.iterdir():
        subprocess.run(["chmod", "-R", "u+rwx", "--", str(child)], check=False)
        subprocess.run(["rm", "-rf", "--", str(child)], check=True)


def _deep_tree(root: Path, depth: int) -> None:
    """``root/a/a/…`` ``depth`` folders deep, a file at the bottom, folders 0555 as an unpack
    makes them (made through descriptors, as a path this long may pass PATH_MAX)."""
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    fds = [fd]
    for _ in range(depth):
        os.mkdir("a", 0o755, dir_fd=fd)
        fd = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        fds.append(fd)
        if len(fds) > 64:  # keep few descriptors open: close the older ones
            os.close(fds.pop(0))
    os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o444, dir_fd=fd))
    for fd in fds:
        os.fchmod(fd, 0o555)
        os.close(fd)


def test_the_reviewers_deep_archive_is_refused_and_the_cache_stays_usable(deep_tmp: Path) -> None:
    """20 members 1,900 folders deep passed maxUnpackedFiles=20, made 38,022 folders, then a
    RecursionError; the clean-up failed too and AssetCache.usage() failed from then on. Now
    refused by depth, nothing left, and a clean archive fetches after it."""
    tmp_path = deep_tmp

    def add(t: tarfile.TarFile) -> None:
        for k in range(20):
            _member(t, f"m{k}/" + "a/" * 1900 + "f")

    data = _tar(add, "w:gz")
    assert len(data) < 4096
    with pytest.raises(AssetUnavailable, match="1,902 parts deep"):
        _fetch(tmp_path, data, "tar")
    cache = AssetCache.of_state(tmp_path / "state")
    assert list((cache.root / "trees").iterdir()) == []
    assert cache.usage() == len(data)
    clean = _tar(lambda t: _member(t, "d/ok.txt", b"ok"))
    _fetch(tmp_path, clean, "tar", name="clean")  # the same cache
    assert (cache.tree(hashlib.sha256(clean).hexdigest(), "tar") / "d" / "ok.txt").exists()


def test_debris_of_an_old_deep_unpack_is_swept_and_not_counted(deep_tmp: Path) -> None:
    """A tree 1,500 folders deep (deeper than Python's recursion limit, as an earlier runner
    could leave one) in trees/ as a temporary folder: usage() still answers, and prune and the
    next fetch of that digest remove it, read-only folders and all."""
    tmp_path = deep_tmp
    cache = AssetCache.of_state(tmp_path / "state")
    cache.prepare()
    hexd = "0" * 64
    _deep_tree(cache.root / "trees" / f".{hexd}.tar.999999.tmp", 1500)
    assert cache.usage() == 0
    prune(cache, StateDir(tmp_path / "state"))
    assert list((cache.root / "trees").iterdir()) == []
    data = _tar(lambda t: _member(t, "d/ok.txt", b"ok"))
    hexd = hashlib.sha256(data).hexdigest()
    _deep_tree(cache.root / "trees" / f".{hexd}.tar.999999.tmp", 1500)
    _fetch(tmp_path, data, "tar")
    assert [p.name for p in (cache.root / "trees").iterdir()] == [f"{hexd}.tar"]


def test_remove_tree_removes_a_deep_read_only_tree_without_following_links(
    deep_tmp: Path,
) -> None:
    tmp_path = deep_tmp
    _deep_tree(tmp_path / "deep", 1200)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (tmp_path / "deep").chmod(0o755)
    (tmp_path / "deep" / "link").symlink_to(outside)
    (tmp_path / "deep").chmod(0o555)
    archives.remove_tree(tmp_path / "deep")
    assert not (tmp_path / "deep").exists()
    assert (outside / "keep.txt").read_text() == "keep"


def test_a_failure_while_unpacking_is_a_refusal_and_leaves_nothing(tmp_path: Path) -> None:
    """A name within the caps whose full path in the cache passes PATH_MAX: the OSError
    (ENAMETOOLONG) is the archive's refusal, not an uncaught error, and nothing is left."""
    name = "/".join(["y" * 255] * 15) + "/" + "z" * 200
    data = _tar(lambda t: _member(t, name))
    (tmp_path / "archive").write_bytes(data)
    asset = Asset.model_validate(
        {"id": "long", "sources": ["archive"], "size": len(data), "path": "tree",
         "sha256": "sha256:" + hashlib.sha256(data).hexdigest(), "unpack": "tar"}
    )  # fmt: skip
    cache = AssetCache.of_state(tmp_path / "state")
    grant = AssetGrant(maxUnpackedBytes=1024 * 1024, maxUnpackedFiles=100)
    with pytest.raises(AssetUnavailable, match=r"cannot unpack: .*File name too long"):
        fetch(asset, tmp_path, cache, grant)
    assert list((cache.root / "trees").iterdir()) == []


def test_a_tree_is_on_disk_before_it_is_renamed_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every file and folder of the unpacked tree is fsynced before the rename that makes it
    visible, and the folder it is renamed into after (a crash never leaves a partial tree
    under the digest). The real fsync runs; the spy only notes which path each was for."""
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(src: object, dst: object) -> None:
        events.append(("rename", os.fspath(src)))  # type: ignore[arg-type]
        real_rename(src, dst)  # type: ignore[arg-type]

    def add(t: tarfile.TarFile) -> None:
        _member(t, "d/", b"", type=tarfile.DIRTYPE)
        _member(t, "d/a.txt", b"hello")
        _member(t, "e/f/b.txt", b"world")

    data = _tar(add)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    cache = _fetch(tmp_path, data, "tar")
    monkeypatch.undo()
    tree = cache.tree(hashlib.sha256(data).hexdigest(), "tar")
    (at,) = [i for i, e in enumerate(events) if e[0] == "rename"]
    tmp = events[at][1]
    before = {p for kind, p in events[:at] if kind == "fsync"}
    want = {os.path.join(tmp, rel) for rel in ("", "d", "d/a.txt", "e", "e/f", "e/f/b.txt")}
    assert {os.path.normpath(p) for p in want} <= {os.path.normpath(p) for p in before}
    assert ("fsync", str(tree.parent)) in events[at:]
    assert (tree / "e" / "f" / "b.txt").read_bytes() == b"world"


PER_MEMBER = ["dotdot", "dotdot-inside", "absolute", "symlink-out", "symlink-in", "hardlink",
              "char-device", "block-device", "fifo", "too-deep", "long-part"]  # fmt: skip


@pytest.mark.parametrize("name", PER_MEMBER)
def test_one_member_check_for_unpacking_and_for_scanning(name: str) -> None:
    """What the unpacker refuses by a member's kind or name, check_tar_member (the one check,
    which runner verify-bundle's first pass also uses) refuses from the header alone, with
    the same message; a link is told from a device or FIFO."""
    data, says = HOSTILE_TARS[name]
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        *fine, member = tar.getmembers()  # the special ones come after an ok.txt
    assert [archives.check_tar_member(m) for m in fine] in ([], [["ok.txt"]])
    with pytest.raises(archives.UnsafeArchive, match=says) as refused:
        archives.check_tar_member(member)
    kind = refused.value
    assert isinstance(kind, archives.RefusedKind) == (says in ("is a link", "device, FIFO"))
    if isinstance(kind, archives.RefusedKind):
        assert kind.link == (says == "is a link")


def test_the_member_check_passes_files_and_folders() -> None:
    folder, file = tarfile.TarInfo("./a/b/"), tarfile.TarInfo("a/b/c.txt")
    folder.type = tarfile.DIRTYPE
    assert archives.check_tar_member(folder) == ["a", "b"]
    assert archives.check_tar_member(file) == ["a", "b", "c.txt"]
    deep = tarfile.TarInfo("a/" * 100 + "f")
    assert len(archives.check_tar_member(deep, strict=False)) == 101  # a bundle's may be deep
