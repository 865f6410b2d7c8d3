"""What the asset cache and the input cache share: a content-addressed store below the state
folder, one digest (its hex) per entry, with the same two folders beside the entries::

    <state>/cache/<name>/
        meta/<hex>.json    what the entry was made or fetched for, when, when last used
        locks/<hex>.lock   flock(2) per digest (:mod:`runner.core.locks`): one writer at a
                           time; prune takes it without waiting

and the folders each keeps its entries in (:attr:`Store.FOLDERS`: the asset cache's sha256/,
trees/, partial/; the input cache's entries/, tmp/). How an entry is made, published, checked
and removed is each cache's own (:mod:`runner.caches.assets`, :mod:`runner.caches.inputcache`);
listing and pruning both, in one LRU order, is :mod:`runner.caches.assetcache`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar, Self

from runner.core import locks

__all__ = ["Store", "now"]


def now() -> str:
    """This moment as the meta files record it (UTC, ISO 8601, seconds)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Store:
    """A content-addressed store at ``root``: meta/ and locks/ per digest, and ``FOLDERS``."""

    root: Path
    NAME: ClassVar[str]
    """Its folder below ``<state>/cache/``."""
    FOLDERS: ClassVar[tuple[str, ...]]
    """Every folder below ``root`` (meta and locks included), made by :meth:`prepare`."""

    @classmethod
    def of_state(cls, state_root: Path) -> Self:
        return cls(state_root / "cache" / cls.NAME)

    def meta(self, hexd: str) -> Path:
        return self.root / "meta" / f"{hexd}.json"

    def lock_file(self, hexd: str) -> Path:
        return self.root / "locks" / f"{hexd}.lock"

    def prepare(self) -> None:
        for sub in self.FOLDERS:
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def locked(
        self, hexd: str, *, wait: bool = True, timeout: float | None = None
    ) -> Iterator[bool]:
        """Hold the digest's lock (exclusive); yields False when ``wait`` is off, or
        ``timeout`` seconds have passed, and another holds it. One open file description per
        use: never nest two for one digest."""
        self.prepare()
        with locks.flocked(self.lock_file(hexd), wait=wait, timeout=timeout) as got:
            yield got
