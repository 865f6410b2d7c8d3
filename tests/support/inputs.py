"""Changes to a contract's inputs after they were bound (pinned or signed), each with the
words the refusal must say: one byte of a repository file, a file added, a file removed, a
symbolic link retargeted, the paper changed. The contract's folder is the toy's, with a link
``repository/data.txt -> labels.txt`` added before binding (:func:`add_link`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def add_link(folder: Path) -> None:
    os.symlink("labels.txt", folder / "repository" / "data.txt")


def _one_byte(folder: Path) -> None:
    path = folder / "repository" / "labels.txt"
    data = path.read_bytes()
    path.write_bytes(bytes([data[0] ^ 1]) + data[1:])


def _retarget(folder: Path) -> None:
    (folder / "repository" / "data.txt").unlink()
    os.symlink("evaluate.py", folder / "repository" / "data.txt")


INPUT_CHANGES: dict[str, tuple[Callable[[Path], object], str, str]] = {
    "one byte": (_one_byte, "repository", "repository/labels.txt changed (its bytes differ)"),
    "added": (
        lambda f: (f / "repository" / "extra.py").write_text("x = 1\n"),
        "repository",
        "repository/extra.py was added",
    ),
    "removed": (
        lambda f: (f / "repository" / "checkpoint.json").unlink(),
        "repository",
        "repository/checkpoint.json was removed",
    ),
    "retargeted": (
        _retarget,
        "repository",
        "repository/data.txt is a symbolic link that was retargeted",
    ),
    "paper": (
        lambda f: (f / "paper.md").write_text("another paper\n"),
        "paper",
        "paper.md changed",
    ),
}
"""name → (change the contract's folder, the input it changes, what the refusal says)."""
