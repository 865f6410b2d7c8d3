"""Image pins: what a contract's ``environment.image`` may say, and checking a local image.

A pin is either a manifest digest (``name@sha256:…``) or an image id (``sha256:…``, the config
digest: the pin for images built or loaded locally). A tag alone pins nothing and is refused
unless the host allows unpinned images.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from runner.errors import ImageDigestMismatch, PolicyViolation

_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
_DIGEST_REF = re.compile(r"^(?P<name>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._/:-]*(?::[A-Za-z0-9_.-]+)?$")


@dataclass(frozen=True)
class ImagePin:
    """A parsed ``environment.image`` (and optional ``environment.imageId``)."""

    reference: str
    """The reference as written in the contract."""
    name: str | None
    """Repository name, without tag or digest (None for a bare image id)."""
    manifest_digest: str | None
    image_id: str | None

    @property
    def lookup(self) -> str:
        """What to ask the engine for."""
        return self.reference


@dataclass(frozen=True)
class ImageInfo:
    """What the engine says about a local image."""

    id: str
    repo_digests: tuple[str, ...]
    repo_tags: tuple[str, ...]
    architecture: str
    os: str
    size: int


def _repository(name: str) -> str:
    """``registry:5000/x/y:tag`` → ``registry:5000/x/y`` (a port colon is not a tag)."""
    last = name.rsplit("/", 1)[-1]
    return name[: len(name) - len(last)] + last.split(":", 1)[0]


def registry_of(reference: str) -> str | None:
    """The registry host an image reference points at; None for a bare local image id."""
    if _ID.match(reference):
        return None
    first, sep, _ = reference.split("@", 1)[0].partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def parse_pin(reference: str, image_id: str | None, *, allow_unpinned: bool) -> ImagePin:
    """Parse the contract's image fields; refuse a tag-only reference unless allowed."""
    if _ID.match(reference):
        if image_id and image_id != reference:
            raise ImageDigestMismatch(
                f"$.environment.imageId is {image_id} but $.environment.image pins {reference}",
                hint="pin the image once, with `runner pin`",
            )
        return ImagePin(reference, None, None, reference)
    match = _DIGEST_REF.match(reference)
    if match:
        name = match.group("name")
        return ImagePin(reference, _repository(name), match.group("digest"), image_id)
    if not _NAME.match(reference):
        raise PolicyViolation(
            f"$.environment.image: {reference!r} is not an image reference",
            hint="use name@sha256:<manifest digest> or sha256:<image id>",
        )
    if not allow_unpinned:
        raise PolicyViolation(
            f"$.environment.image: {reference!r} is a tag, which can point at different bytes "
            "tomorrow; this host runs only images pinned by content",
            hint="pin it: `runner pin task.json --image "
            f"{reference}` writes its image id into the contract (or use name@sha256:<digest>)",
        )
    return ImagePin(reference, _repository(reference), None, image_id)


def verify(pin: ImagePin, info: ImageInfo) -> str | None:
    """Check that ``info`` is the pinned image; return the matching repo digest, if any."""
    if pin.image_id and info.id != pin.image_id:
        raise ImageDigestMismatch(
            f"the local image for {pin.reference} has id {info.id}, the contract pins "
            f"{pin.image_id}",
            hint="the image was rebuilt or retagged; re-pin the contract or restore the image",
        )
    if pin.manifest_digest:
        wanted = f"{pin.name}@{pin.manifest_digest}"
        if not any(d == wanted or d.endswith("/" + wanted) for d in info.repo_digests):
            raise ImageDigestMismatch(
                f"the local image {info.id} is not known by the manifest digest "
                f"{pin.manifest_digest} "
                f"(its repo digests: {', '.join(info.repo_digests) or 'none'})",
                hint="pull the image by digest, or pin its image id instead",
            )
        return wanted
    return info.repo_digests[0] if info.repo_digests else None
