"""The contract's ``assets``: datasets and checkpoints the runner fetches, verifies and mounts
read-only under ``/job/assets`` (README, 'Assets'), and the legacy entries it only carries."""

from __future__ import annotations

import posixpath
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, ConfigDict, Discriminator, Field, Tag

from runner.contract.base import Sha256, _no_control, _Open, _relative_path, _Strict

__all__ = ["Asset", "AssetEntry", "CarriedAsset"]

ASSET_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
ASSET_FIELDS = frozenset({"sources", "sha256", "size", "path", "unpack"})
"""An asset naming any of these is one the runner fetches (every one then checked)."""


def _asset_source(value: str) -> str:
    """An http(s) URL without credentials, or a path relative to the contract's folder."""
    _no_control(value)
    if any(c.isspace() for c in value):
        raise ValueError(f"must not contain whitespace, got {value!r}")
    scheme = value.split(":", 1)[0].lower() if ":" in value else ""
    if scheme in ("http", "https"):
        parts = urlsplit(value)
        if not parts.hostname:
            raise ValueError(f"an {scheme} URL needs a host, got {value!r}")
        if parts.username is not None or parts.password is not None:
            raise ValueError("a source URL must not carry credentials (user:password@)")
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number in range
        except ValueError as exc:
            raise ValueError(f"bad port in {value!r}: {exc}") from None
        return value
    if scheme and "/" not in value.split(":", 1)[0] and len(scheme) > 1:
        raise ValueError(
            f"source scheme {scheme!r} is not supported: use http://, https:// or a path "
            "relative to the contract's folder"
        )
    return _relative_path(value)


def _asset_path(value: str) -> str:
    value = _relative_path(value)
    if posixpath.normpath(value) != value or value == ".":
        raise ValueError(
            f"must be a normalized path below /job/assets (no '.', '//' or trailing '/'), "
            f"got {value!r}"
        )
    return value


AssetSource = Annotated[str, Field(min_length=1, max_length=4096), AfterValidator(_asset_source)]


class Asset(_Strict):
    """A dataset or checkpoint the runner fetches on the host, verifies by its SHA-256 and
    size, keeps in its content-addressed cache and mounts read-only at /job/assets/<path>."""

    id: str = Field(pattern=ASSET_ID_PATTERN, description="The asset's id, unique in assets.")
    sources: list[AssetSource] = Field(
        min_length=1,
        max_length=16,
        description="Where the bytes may be fetched, tried in order: http:// or https:// URLs "
        "(the host policy's assets.allowHosts decides which hosts), or a path relative to the "
        "contract's folder.",
    )
    sha256: Sha256 = Field(description="SHA-256 of the bytes ('sha256:<hex>'); the archive's "
                           "when unpack is given.")  # fmt: skip
    size: int = Field(ge=0, le=2**50, description="Size of the bytes, exactly.")
    path: Annotated[str, AfterValidator(_asset_path)] = Field(
        description="Where it appears, relative to /job/assets (a file, or a folder when unpacked)."
    )
    unpack: Literal["tar", "zip"] | None = Field(
        default=None,
        description="Unpack the archive (tar, optionally gzip/bzip2/xz compressed, or zip) and "
        "mount the folder instead: regular files and folders only, no absolute paths, no '..', "
        "within the host policy's caps on bytes and files.",
    )
    description: str | None = Field(default=None, description="Carried for the job.")
    acquisition: Any = Field(default=None, description="Carried for the job.")


class CarriedAsset(_Open):
    """A legacy asset entry (id, acquisition hints ...): carried for the job, not fetched."""

    model_config = ConfigDict(
        extra="allow",
        frozen=True,
        # In the JSON Schema too, an entry naming any fetched field is an Asset, never this.
        json_schema_extra={"not": {"anyOf": [{"required": [k]} for k in sorted(ASSET_FIELDS)]}},
    )

    id: str | None = None


def _asset_kind(value: Any) -> str:
    if isinstance(value, dict) and ASSET_FIELDS & value.keys():
        return "asset"
    if isinstance(value, Asset):
        return "asset"
    return "carried"


AssetEntry = Annotated[
    Annotated[Asset, Tag("asset")] | Annotated[CarriedAsset, Tag("carried")],
    Discriminator(_asset_kind),
]
