"""A bundle of one run that anyone can verify offline: ``runner export`` and
``runner verify-bundle``.

The bundle is a BagIt bag (RFC 8493, made and validated with the Library of Congress's
``bagit`` package) serialized as one tar archive (``.tar``, or ``.tar.gz``/``.tgz``) whose
single top folder is the bag::

    <name>/                       the archive's name less .tar / .tar.gz / .tgz
      bagit.txt  bag-info.txt     BagIt's own tag files
      manifest-sha256.txt         sha256 of every payload file (those stored beside too)
      fetch.txt                   only when files are stored beside: where each one is
      runner-bundle.json          this bundle's own record: what is beside, what was skipped
                                  and why, the public keys it was made with (never trusted)
      tagmanifest-sha256.txt      sha256 of each file above
      bundle.intoto.json          the seal: an in-toto statement, DSSE-signed with the runner's
                                  key, whose one subject is tagmanifest-sha256.txt
      data/                       the payload, laid out as the job folder is
        result.json  result.intoto.json  result.envelope.intoto.json
        input/task.json  input/task.dsse.json  input/parser-catalog.json
        execution/input-manifest.json  execution/runtime-budget.json
        record/...                every file of record/ but its lock
        output/...                every file the envelope hashed (evidence, logs, the job's
                                  result.json and the files it lists)

So the seal covers the tag manifest, which covers the manifest and the other tag files,
which cover every payload file: one changed byte anywhere fails verification, and the check
names the file. A payload file over the inline threshold is stored beside the archive as
``<archive>.blobs/sha256/<hex>``, listed in ``manifest-sha256.txt`` with its digest and in
``fetch.txt`` as ``file:sha256/<hex>`` (relative to that folder), the BagIt way of a bag
with holes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.models.envelope import ResultEnvelope

__all__ = [
    "BLOB_PREFIX",
    "FETCH",
    "INFO_FILE",
    "INFO_KIND",
    "MANIFEST",
    "SEAL_FILE",
    "SEAL_PREDICATE",
    "TAGMANIFEST",
    "blobs_dir",
    "compressed",
    "is_archive_name",
    "output_files",
    "representable",
    "stem",
]

SEAL_FILE = "bundle.intoto.json"
INFO_FILE = "runner-bundle.json"
MANIFEST = "manifest-sha256.txt"
TAGMANIFEST = "tagmanifest-sha256.txt"
FETCH = "fetch.txt"
SEAL_PREDICATE = "https://github.com/citeark/runner/bundle/v1"
INFO_KIND = "runner.bundle-info"
BLOB_PREFIX = "file:sha256/"
"""A fetch.txt URL: this, then the hex digest, relative to the blobs folder."""

_SUFFIXES = (".tar.gz", ".tgz", ".tar")


def stem(archive: Path) -> str:
    """The bag's folder name inside ``archive``: its file name less the archive suffix."""
    name = archive.name
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def is_archive_name(archive: Path) -> bool:
    return archive.name.endswith(_SUFFIXES)


def compressed(archive: Path) -> bool:
    return archive.name.endswith((".tar.gz", ".tgz"))


def blobs_dir(archive: Path) -> Path:
    """Where the files stored beside ``archive`` go: ``<archive>.blobs/``."""
    return archive.with_name(archive.name + ".blobs")


def representable(rel: str) -> bool:
    """Whether a path can be written in a BagIt manifest line and read back as it is:
    bagit.py strips a line's ends and decodes only %0A and %0D, so no control character,
    no such escape, and no space at either end of the name or of any folder in it."""
    if any(ord(c) < 32 or ord(c) == 127 for c in rel):
        return False
    if "%0a" in rel.lower() or "%0d" in rel.lower():
        return False
    return all(part == part.strip() and part for part in rel.split("/"))


def output_files(envelope: ResultEnvelope) -> Iterator[tuple[str, str | None, str | None]]:
    """``(path under output/, "sha256:<hex>" or None, why it has none)`` of every output file
    the envelope names: evidence, stdout and stderr, the job's result.json and the files it
    lists."""
    for m in envelope.measurements:
        yield m.evidence.path, m.evidence.sha256, None
    refs = list(envelope.logs)
    if envelope.agentResult is not None:
        refs += [envelope.agentResult.file, *envelope.agentResult.listed]
    for ref in refs:
        yield ref.path, ref.sha256, ref.problem or (None if ref.exists else "does not exist")
