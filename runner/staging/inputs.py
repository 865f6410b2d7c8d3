"""Inputs bound to the contract: the digest of a staged file or folder, the listings file that
names the first path where two versions of a folder differ, and the check of a git checkout
against the commit the contract names.

**Digest** (``paper.digest``, ``repository.digest``: ``sha256:<64 hex>``). A file's digest is
the SHA-256 of its bytes (what ``sha256sum`` prints). A folder's is the SHA-256 of its
``runner-tree-v1`` listing: one line per entry below the folder, sorted by the UTF-8 bytes of
its ``/``-separated path relative to the folder::

    D <path>\\n                  a folder (so empty folders count)
    F <sha256 hex> <path>\\n     a regular file: SHA-256 of its bytes
    X <sha256 hex> <path>\\n     a regular file its owner may execute (the one mode bit that
                                counts, as in git)
    L <sha256 hex> <path>\\n     a symbolic link: SHA-256 of the link's target text (never
                                followed)

Nothing else counts (times, owners, other mode bits). A name holding a control character or
bytes that are not UTF-8 cannot be listed unambiguously and is refused. The runner computes the
digest of what it staged, while copying (:mod:`runner.staging.jobdir`), so what is checked is what
the job gets.

**Listings file.** The issuer's commands (``runner pin``, ``runner sign``) write the listings
of the contract's folder inputs beside the contract as ``<stem>.inputs.json`` (stem: the
contract file's name up to its first ``.``). When a staged folder's digest differs from the
contract's, the runner compares the staged listing with that one, if it hashes to the
contract's digest, and names the first differing path.

**Git.** When ``repository.commit`` looks like a commit id and the staged repository holds a
``.git`` folder, the staged working tree (without ``.git``) must be exactly that commit's
tree: the same paths, kinds (file, executable file, link, folder) and blob ids. Objects are
read with dulwich (pure Python: no hook, filter or configured command of the repository ever
runs), from the staged copy only, each checked against its id.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from runner.core import jsondepth, safefs
from runner.core.errors import InputDigestMismatch

__all__ = [
    "FORMAT",
    "MAX_LISTINGS_BYTES",
    "Entry",
    "Kind",
    "check_commit",
    "digest_of",
    "first_difference",
    "listing",
    "listings_document",
    "listings_name",
    "looks_like_commit",
    "mismatch",
    "name_problem",
    "parse_listing",
    "read_listing",
    "tree_digest",
]

FORMAT = "runner-tree-v1"
LISTINGS_SUFFIX = ".inputs.json"
MAX_LISTINGS_BYTES = 512 * 1024 * 1024
"""A listings file is read only up to this size (100,000 entries of long paths fit well)."""

Kind = Literal["D", "F", "X", "L"]
_WORDS: dict[str, str] = {
    "D": "a folder",
    "F": "a file",
    "X": "an executable file",
    "L": "a symbolic link",
    "S": "a submodule (gitlink)",
}
_HEX = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^(?:[0-9a-fA-F]{7,40}|[0-9a-fA-F]{64})$")


@dataclass(frozen=True)
class Entry:
    """One entry below an input folder: its kind, path (relative, ``/``-separated) and the hex
    SHA-256 of its bytes (a file) or of its target text (a link); empty for a folder."""

    kind: Kind
    path: str
    sha256: str = ""

    def line(self) -> str:
        if self.kind == "D":
            return f"D {self.path}\n"
        return f"{self.kind} {self.sha256} {self.path}\n"


def _order(path: str) -> bytes:
    return path.encode("utf-8", "surrogateescape")


def name_problem(name: str) -> str | None:
    """Why a name below an input cannot be listed (None: it can): a control character would
    break the one-entry-a-line listing, and a name that is not UTF-8 has no UTF-8 order."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "has a name that is not UTF-8"
    bad = next((c for c in name if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0), None)
    if bad is not None:
        return f"has a name with a control character ({bad!r})"
    return None


def listing(entries: Iterable[Entry]) -> str:
    """The runner-tree-v1 listing of ``entries``."""
    return "".join(e.line() for e in sorted(entries, key=lambda e: _order(e.path)))


def digest_of(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tree_digest(entries: Iterable[Entry]) -> str:
    """The runner-tree-v1 digest of a folder whose entries are ``entries``."""
    return digest_of(listing(entries).encode("utf-8"))


def parse_listing(text: str) -> dict[str, Entry]:
    """A listing's entries by path; ValueError for text that is not a runner-tree-v1 listing."""
    out: dict[str, Entry] = {}
    if text and not text.endswith("\n"):
        raise ValueError("it does not end with a newline")
    for n, line in enumerate(text.splitlines(), 1):
        kind, _, rest = line.partition(" ")
        if kind == "D":
            entry = Entry("D", rest)
        elif kind in ("F", "X", "L"):
            sha, _, path = rest.partition(" ")
            if not _HEX.match(sha):
                raise ValueError(f"line {n} has no SHA-256")
            entry = Entry(kind, path, sha)  # type: ignore[arg-type]
        else:
            raise ValueError(f"line {n} starts with {kind[:8]!r}, not D, F, X or L")
        if not entry.path or entry.path in out:
            raise ValueError(f"line {n} has an empty or repeated path")
        out[entry.path] = entry
    return out


@dataclass(frozen=True)
class Difference:
    """The first path (in listing order) where two versions of an input differ, and how."""

    path: str
    what: str


def _how(expected: Entry | None, found: Entry | None, theirs: str, ours: str) -> str:
    if found is None:
        return f"was removed (it is in {theirs}, not in {ours})"
    if expected is None:
        return f"was added (it is in {ours}, not in {theirs})"
    if expected.kind == found.kind == "L":
        return "is a symbolic link that was retargeted"
    if expected.kind == found.kind:
        return "changed (its bytes differ)"
    if {expected.kind, found.kind} == {"F", "X"}:
        also = " and its bytes" if expected.sha256 != found.sha256 else ""
        return f"changed its executable bit{also}"
    return f"changed from {_WORDS[expected.kind]} to {_WORDS[found.kind]}"


def first_difference(
    expected: Mapping[str, Entry],
    found: Mapping[str, Entry],
    theirs: str = "the contract's listing",
    ours: str = "the staged input",
) -> Difference | None:
    """The first path, in listing order, whose entry differs; None when none does. ``theirs``
    and ``ours`` name the two sides in the words said."""
    for path in sorted(set(expected) | set(found), key=_order):
        a, b = expected.get(path), found.get(path)
        if a != b:
            return Difference(path, _how(a, b, theirs, ours))
    return None


# ------------------------------------------------------------------ the listings file


def listings_name(contract_name: str) -> str:
    """``task.json``, ``task.dsse.json``, ``task.pinned.json`` → ``task.inputs.json``."""
    return contract_name.split(".", 1)[0] + LISTINGS_SUFFIX


def listings_document(listings: Mapping[str, str]) -> bytes:
    """The listings file's bytes: ``{"schemaVersion", "format", "inputs": {field: listing}}``."""
    doc = {"schemaVersion": "1.0", "format": FORMAT, "inputs": dict(listings)}
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def read_listing(folder: Path, contract_name: str, field: str, digest: str) -> dict[str, Entry]:
    """The entries of ``field``'s listing in the listings file beside a contract, when that
    listing hashes to ``digest``. ValueError saying why it cannot be used, otherwise."""
    name = listings_name(contract_name)
    try:
        with safefs.open_under(folder, name) as f:
            raw = f.read(MAX_LISTINGS_BYTES + 1)
    except safefs.UnsafePath as exc:
        raise ValueError(f"{name} {exc.problem}") from None
    except OSError as exc:
        raise ValueError(f"{name} cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_LISTINGS_BYTES:
        raise ValueError(f"{name} is larger than {MAX_LISTINGS_BYTES:,} bytes")
    try:
        doc = jsondepth.loads(raw.decode("utf-8"))
        text = doc["inputs"][field] if doc.get("format") == FORMAT else None
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(f"{name} has no {FORMAT} listing for {field}") from None
    if not isinstance(text, str):
        raise ValueError(f"{name} has no {FORMAT} listing for {field}")
    if digest_of(text.encode("utf-8")) != digest:
        raise ValueError(
            f"the listing of {field} in {name} hashes to {digest_of(text.encode('utf-8'))}, "
            f"not to the contract's {digest} (it is from another version of the input)"
        )
    try:
        return parse_listing(text)
    except ValueError as exc:
        raise ValueError(f"the listing of {field} in {name} is malformed: {exc}") from None


def mismatch(
    field: str,
    rel: str,
    expected: str,
    found: str,
    staged: Mapping[str, Entry] | None,
    folder: Path,
    contract_name: str,
) -> InputDigestMismatch:
    """The refusal of an input (``field``, staged at ``rel``) whose digest ``found`` is not the
    contract's ``expected``, naming the first differing path when the listings file allows."""
    digest_field = (
        "$.agent.promptDigest"
        if field == "$.agent.promptPath"
        else field.rsplit(".", 1)[0] + ".digest"
    )
    where = rel
    if staged is None:  # a single file: the input itself differs
        what = "changed"
    else:
        try:
            diff = first_difference(read_listing(folder, contract_name, field, expected), staged)
        except ValueError as exc:
            diff = None
            what = f"differs; the first differing path cannot be named: {exc}"
        else:
            if diff is None:  # the listings agree and the digests do not: cannot happen
                what = "differs"
            else:
                where, what = f"{rel}/{diff.path}", diff.what
    return InputDigestMismatch(
        f"{field}: {where} {what}: {digest_field} is {expected}, the staged input hashes to "
        f"{found}",
        hint="if the change is intended, re-pin the inputs (`runner pin CONTRACT`, or "
        "`runner sign --repin-inputs`) and sign the contract again; otherwise restore the input",
    )


# ------------------------------------------------------------------ git


def looks_like_commit(value: str | None) -> bool:
    """Whether ``repository.commit`` is a commit id (7 to 40 hex digits, or 64)."""
    return value is not None and _COMMIT.match(value) is not None


class _Unreadable(Exception):
    """The staged .git cannot answer the question; the message says why."""


def check_commit(
    root: Path, rel: str, commit: str, staged: Mapping[str, Entry], max_entries: int
) -> bool:
    """Check that the staged repository at ``root`` (staged as ``rel``; ``staged`` its entries)
    is exactly commit ``commit``'s tree, ``.git`` aside. False when there is no ``.git`` to
    check against; raises :class:`InputDigestMismatch` naming the first differing path, or
    why the commit cannot be read from the staged copy."""
    git = staged.get(".git")
    if git is None:
        return False
    field = "$.repository.commit"

    def refuse(what: str, path: str = ".git") -> InputDigestMismatch:
        return InputDigestMismatch(
            f"{field}: {rel}/{path} {what} (the contract names commit {commit})",
            hint="stage a checkout of exactly that commit (`git status --ignored` shows what "
            "differs), or name the commit the tree is; then re-pin (`runner pin CONTRACT`) and "
            "sign the contract again",
        )

    if git.kind != "D":
        raise refuse(
            "is not a folder (a worktree's or submodule's pointer): the commit's objects are "
            "not staged, so the tree cannot be checked against it"
        )
    for path, entry in staged.items():
        if path.startswith(".git/") and entry.kind == "L":
            raise refuse("is a symbolic link inside .git; the runner never reads through one", path)
    for outside in (".git/objects/info/alternates", ".git/commondir"):
        if outside in staged:
            raise refuse(
                "points to objects outside the staged repository, which the runner does not "
                "read; stage a repository that holds its own objects (`git repack -a -d`)",
                outside,
            )
    try:
        tree = _commit_tree(root / ".git", commit.lower(), staged, max_entries)
    except _Unreadable as exc:
        raise refuse(str(exc)) from None
    work = {p: e for p, e in staged.items() if p != ".git" and not p.startswith(".git/")}
    found = {p: _git_entry(root, e, tree.format) for p, e in work.items()}
    for path in sorted(set(tree.entries) | set(found), key=_order):
        want, got = tree.entries.get(path), found.get(path)
        if want == got:
            continue
        if want is not None and want[0] == "S":
            raise refuse("is a submodule; the runner does not check submodules (vendor it)", path)
        if want is None:
            raise refuse(f"is in the staged tree and not in the commit ({_word(got)})", path)
        if got is None:
            raise refuse(f"is in the commit and not in the staged tree ({_word(want)})", path)
        if want[0] != got[0]:
            raise refuse(f"is {_word(got)} here and {_word(want)} in the commit", path)
        raise refuse("differs from the commit's (its git blob id differs)", path)
    return True


def _word(entry: tuple[str, str] | None) -> str:
    return _WORDS[entry[0]] if entry else "nothing"


@dataclass(frozen=True)
class _Tree:
    entries: dict[str, tuple[str, str]]
    """path → (kind D/F/X/L/S, hex object id; empty for a folder)."""
    format: str


def _git_entry(root: Path, entry: Entry, object_format: str) -> tuple[str, str]:
    """The staged entry as git would record it: kind and blob id."""
    if entry.kind == "D":
        return ("D", "")
    h = hashlib.new(object_format)
    if entry.kind == "L":
        with safefs.parent_fd(root, entry.path) as (fd, name):
            target = safefs.readlink_at(fd, name, entry.path)
        h.update(b"blob %d\0" % len(target) + target)
        return ("L", h.hexdigest())
    with safefs.open_under(root, entry.path) as f:
        size = f.seek(0, io.SEEK_END)
        f.seek(0)
        h.update(b"blob %d\0" % size)
        while chunk := f.read(1024 * 1024):
            h.update(chunk)
    return (entry.kind, h.hexdigest())


def _object_format(git: Path, staged: Mapping[str, Entry]) -> str:
    """``sha1`` or ``sha256``, from the staged ``.git/config`` (parsed, includes ignored)."""
    if ".git/config" not in staged:
        return "sha1"
    from dulwich.config import ConfigFile

    with safefs.open_under(git, "config") as f:
        raw = f.read(1024 * 1024)
    try:
        config = ConfigFile.from_file(io.BytesIO(raw), expand_includes=False)
        name = config.get((b"extensions",), b"objectformat")
    except KeyError:
        return "sha1"
    except ValueError as exc:
        raise _Unreadable(f"has a config that cannot be parsed ({exc})") from None
    value = name.decode("ascii", "replace").lower()
    if value not in ("sha1", "sha256"):
        raise _Unreadable(f"uses the object format {value!r}, which the runner cannot read")
    return value


def _commit_tree(git: Path, commit: str, staged: Mapping[str, Entry], max_entries: int) -> _Tree:
    """Every path of ``commit``'s tree, each object read from the staged ``git`` folder and
    checked against its id (so a forged object is refused, not believed)."""
    from dulwich import errors as dulwich_errors
    from dulwich.object_format import get_object_format
    from dulwich.object_store import DiskObjectStore
    from dulwich.objects import Commit, ShaFile, Tree

    fmt_name = _object_format(git, staged)
    fmt = get_object_format(fmt_name)
    store = DiskObjectStore(str(git / "objects"), object_format=fmt)

    def read(hexsha: bytes, what: str) -> ShaFile:
        try:
            type_num, raw = store.get_raw(hexsha)  # type: ignore[arg-type]
            return ShaFile.from_raw_string(type_num, raw, object_format=fmt, verify_sha=hexsha)  # type: ignore[arg-type]
        except KeyError:
            raise _Unreadable(f"does not hold {what} {hexsha.decode()}") from None
        except dulwich_errors.ChecksumMismatch:
            raise _Unreadable(
                f"holds an object under the id {hexsha.decode()} whose bytes do not hash to it "
                "(a corrupt or forged repository)"
            ) from None
        except (
            OSError,
            ValueError,
            IndexError,
            AssertionError,
            zlib.error,
            dulwich_errors.ObjectFormatException,
            dulwich_errors.ApplyDeltaError,
            dulwich_errors.FileFormatException,
        ) as exc:
            raise _Unreadable(
                f"cannot be read for {what} {hexsha.decode()}: {type(exc).__name__}: {exc}"
            ) from None

    try:
        if len(commit) == fmt.hex_length:
            ids = [commit.encode()]
        else:
            ids = [bytes(i) for i in _first_two(store.iter_prefix(commit.encode()))]
    except (OSError, ValueError, IndexError, dulwich_errors.FileFormatException) as exc:
        raise _Unreadable(f"cannot be searched: {type(exc).__name__}: {exc}") from None
    if not ids:
        raise _Unreadable(f"does not hold commit {commit} ({fmt_name} object ids)")
    if len(ids) > 1:
        raise _Unreadable(f"holds several objects whose ids start with {commit}")
    obj = read(ids[0], "commit")
    if not isinstance(obj, Commit):
        raise _Unreadable(f"holds {commit} as a {obj.type_name.decode()}, not a commit")
    entries: dict[str, tuple[str, str]] = {}
    todo: list[tuple[bytes, str]] = [(bytes(obj.tree), "")]
    while todo:
        tree_id, prefix = todo.pop()
        tree = read(tree_id, "tree")
        if not isinstance(tree, Tree):
            raise _Unreadable(
                f"holds {tree_id.decode()} as a {tree.type_name.decode()}, not a tree"
            )
        for item in tree.iteritems():
            name = item.path.decode("utf-8", "surrogateescape")
            path = prefix + name
            mode = item.mode
            if mode == 0o040000:
                entries[path] = ("D", "")
                todo.append((bytes(item.sha), path + "/"))
            elif mode == 0o160000:
                entries[path] = ("S", item.sha.decode())
            elif mode == 0o120000:
                entries[path] = ("L", item.sha.decode())
            else:
                entries[path] = ("X" if mode & 0o100 else "F", item.sha.decode())
            if len(entries) > max_entries:
                raise _Unreadable(
                    f"holds a commit whose tree has more than {max_entries:,} entries, more "
                    "than the staged tree"
                )
    return _Tree(entries, fmt_name)


def _first_two(ids: Iterable[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for i in ids:
        out.append(i)
        if len(out) == 2:
            break
    return out
