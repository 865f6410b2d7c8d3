"""Shared pieces of the contract's models: path rules, the digest pattern, strict and open
objects."""

from __future__ import annotations

import posixpath
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

__all__ = [
    "SHA256_PATTERN",
    "ContainerPath",
    "RelativePath",
    "Sha256",
    "_Open",
    "_Strict",
    "_no_control",
    "_relative_path",
]

SHA256_PATTERN = r"^sha256:[0-9a-f]{64}$"


def _no_control(value: str) -> None:
    bad = next((c for c in value if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0), None)
    if bad is not None:
        raise ValueError(
            f"must not contain control characters (newline, tab, escape ...); found {bad!r}"
        )


def _relative_path(value: str) -> str:
    """A POSIX path relative to its base that cannot escape it."""
    if not value or "\x00" in value or "\\" in value:
        raise ValueError("must be a non-empty POSIX path without NUL or backslash")
    _no_control(value)
    if value.startswith("/"):
        raise ValueError(f"must be relative to its base, got the absolute path {value!r}")
    normalized = posixpath.normpath(value)
    if normalized == ".." or normalized.startswith("../") or ".." in value.split("/"):
        raise ValueError(f"must stay inside its base; {value!r} contains '..'")
    return value


def _absolute_container_path(value: str) -> str:
    if not value.startswith("/") or "\x00" in value or ".." in value.split("/"):
        raise ValueError(
            f"must be an absolute path inside the container without '..', got {value!r}"
        )
    _no_control(value)
    return value


RelativePath = Annotated[str, AfterValidator(_relative_path)]
"""A path relative to a base directory; absolute paths and ``..`` are refused."""

ContainerPath = Annotated[str, AfterValidator(_absolute_container_path)]
Sha256 = Annotated[str, Field(pattern=SHA256_PATTERN)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
