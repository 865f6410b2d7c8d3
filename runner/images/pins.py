"""Image pins: what a contract's ``environment.image`` may say, and checking a local image.

A pin is either a manifest digest (``name@sha256:…``) or an image id (``sha256:…``, the config
digest: the pin for images built or loaded locally). A tag alone pins nothing and is refused
unless the host allows unpinned images.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from runner.backends.types import ImageInfo
from runner.core import clock, jsondepth
from runner.core.errors import ImageDigestMismatch, ImageUnavailable, PolicyViolation, RunnerError

if TYPE_CHECKING:
    from runner.backends.base import Backend

__all__ = [
    "Acquired",
    "ImagePin",
    "ImageUnavailable",
    "PullSettings",
    "acquire",
    "bundle_image_ids",
    "load_bundle",
    "normalize_arch",
    "parse_pin",
    "registry_of",
    "repository_of",
]

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


def repository_of(name: str) -> str:
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
        return ImagePin(reference, repository_of(name), match.group("digest"), image_id)
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
    return ImagePin(reference, repository_of(reference), None, image_id)


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


# --------------------------------------------------------------------------- acquiring


_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def normalize_arch(name: str) -> str:
    return _ARCH.get(name.lower(), name.lower())


def bundle_image_ids(bundle: Path) -> list[str]:
    """Image ids (config digests) a ``docker save`` tarball holds, each checked against the
    SHA-256 of its config file in the tarball. Read before anything is loaded."""
    import tarfile  # only for bundles

    try:
        with tarfile.open(bundle) as tar:
            manifest_member = tar.extractfile("manifest.json")
            if manifest_member is None:
                raise ImageUnavailable(f"{bundle} has no manifest.json: not a `docker save` bundle")
            manifest = jsondepth.loads(manifest_member.read())
            ids = []
            for entry in manifest:
                config_name = str(entry["Config"])
                member = tar.extractfile(config_name)
                if member is None:
                    raise ImageUnavailable(f"{bundle}: {config_name} is missing")
                digest = hashlib.sha256()
                while chunk := member.read(1024 * 1024):
                    digest.update(chunk)
                ids.append("sha256:" + digest.hexdigest())
            return ids
    except (tarfile.TarError, KeyError, OSError, ValueError, TypeError) as exc:
        raise ImageUnavailable(
            f"{bundle} is not a readable `docker save` bundle: {exc}",
            hint="make it with `docker save IMAGE -o bundle.tar`",
        ) from exc


class Puller(Protocol):
    def stage(self, name: str, detail: str) -> None: ...

    def transfer(self, label: str, done: int, total: int) -> None: ...


@dataclass(frozen=True)
class PullSettings:
    """Where credentials come from and how long transient registry failures are retried."""

    docker_config: Path | None = None
    insecure_registries: tuple[str, ...] = ()
    retry_seconds: float = 120.0


@dataclass(frozen=True)
class Acquired:
    info: ImageInfo
    source: Literal["local", "pulled", "bundle"]
    repo_digest: str | None


def load_bundle(backend: Backend, bundle: Path, image_id: str | None) -> None:
    """Load ``bundle`` only if it holds ``image_id`` (when given)."""
    ids = bundle_image_ids(bundle)
    if image_id is not None and image_id not in ids:
        raise ImageDigestMismatch(
            f"the bundle {bundle} holds {', '.join(ids) or 'no image'}, not the pinned "
            f"image {image_id}",
            hint="use the bundle made from the pinned image (`docker save` it on the issuer's "
            "side), or re-pin the contract",
        )
    with _engine_words(f"the engine could not load {bundle}", []):
        backend.load(bundle)


@contextlib.contextmanager
def _engine_words(action: str, secrets: list[str]) -> Iterator[None]:
    """The engine's error for a pull or a load, unless it quotes credentials: the engine's
    words quote the registry's, which may echo what the engine sent it (the password,
    ``user:password``, its base64, a token: ``secrets``), and they reach the envelope's
    ``failure.reason``. Such an error is raised again, of its class, as ``action`` and
    :data:`runner.images.answers.LEFT_OUT`: left out whole, as the runner's own check leaves
    a registry's words (:func:`runner.images.answers.quotes_credentials`)."""
    from runner.images import answers

    try:
        yield
    except RunnerError as exc:
        if not answers.quotes_credentials(exc.message, secrets):
            raise
        error = type(exc)(f"{action}: {answers.LEFT_OUT}", hint=exc.hint)
        error.retryable = exc.retryable
        raise error from None


def _pull(backend: Backend, pin: ImagePin, settings: PullSettings, progress: Puller) -> None:
    import tenacity

    from runner.images import registry

    if pin.name is None or pin.manifest_digest is None:
        raise ImageUnavailable(f"{pin.reference} has no manifest digest to pull by")
    ref = registry.parse_reference(pin.name, pin.manifest_digest)
    config = registry.docker_config_path(settings.docker_config)
    creds, searched = registry.find_credentials(ref.registry, config)
    insecure = registry.is_insecure(ref.registry, settings.insecure_registries)
    if creds is not None:
        progress.stage("registry", f"credentials for {ref.registry} from {creds.source}")
    progress.stage("image", f"asking {ref.registry} for {ref.repository}@{ref.digest[:19]}…")
    tries = registry.probe(
        ref,
        creds,
        insecure=insecure,
        within_seconds=settings.retry_seconds,
        searched=searched,
    )
    if tries > 1:
        progress.stage("registry", f"{ref.registry} answered after {tries} tries")
    layers: dict[str, tuple[int, int]] = {}

    def on_chunk(chunk: dict[str, Any]) -> None:
        detail = chunk.get("progressDetail") or {}
        layer = chunk.get("id")
        if layer and detail.get("total"):
            layers[str(layer)] = (int(detail.get("current") or 0), int(detail["total"]))
            done = sum(c for c, _ in layers.values())
            total = sum(t for _, t in layers.values())
            progress.transfer(f"pulling {len(layers)} layer(s)", done, total)

    auth = creds.engine_auth(ref.registry) if creds else None
    sent = registry.secrets_sent(creds)

    def pull_once() -> None:
        try:
            with _engine_words(f"the engine could not pull {ref.pull_name}", sent):
                backend.pull(ref.pull_name, auth, on_chunk)
        except ImageUnavailable:
            # The engine reports a failed pull as text; the registry's status says whether it
            # is worth another try (a 5xx or an outage midway through the layers): a
            # TransientRegistryError is, the engine's own error when the registry is fine is not.
            registry.probe_once(ref, creds, insecure=insecure, timeout=15, searched=searched)
            raise

    def retrying(_: tenacity.RetryCallState) -> None:
        progress.stage("registry", f"{ref.registry} failed during the pull; retrying")

    # Three tries, 2 s then 4 s apart; after the third the registry's error, as the refusal
    # it is (TransientRegistryError is the registry module's signal to retry, no RunnerError:
    # let through, it was a crash of the run rather than image_unavailable, retryable).
    try:
        tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(registry.TransientRegistryError),
            stop=tenacity.stop_after_attempt(3),
            wait=tenacity.wait_incrementing(start=2, increment=2),
            before_sleep=retrying,
            sleep=clock.sleep,
            reraise=True,
        )(pull_once)
    except registry.TransientRegistryError as exc:
        error = ImageUnavailable(
            f"pulling {ref.pull_name} failed three times, the registry failing too: {exc}",
            hint="the registry or the network to it is down; run again later",
        )
        error.retryable = True
        raise error from exc


def acquire(
    backend: Backend,
    pin: ImagePin,
    *,
    bundle: Path | None,
    settings: PullSettings,
    progress: Puller,
) -> Acquired:
    """The pinned image, verified: local if present, else from the bundle, else pulled by
    digest. Raises ImageUnavailable / ImageDigestMismatch; nothing runs unverified."""
    info = backend.inspect_image(pin.lookup)
    source: Literal["local", "pulled", "bundle"] = "local"
    if info is None and bundle is not None:
        if pin.image_id is None:
            raise ImageDigestMismatch(
                f"$.environment.image pins {pin.reference} by manifest digest, which a bundle "
                "cannot prove (`docker load` drops repo digests)",
                hint="pin the image id too ($.environment.imageId, `runner pin` writes it) to "
                "run from a bundle",
            )
        progress.stage("image", f"loading {bundle}")
        load_bundle(backend, bundle, pin.image_id)
        source = "bundle"
        info = backend.inspect_image(pin.image_id)
    elif info is None and pin.manifest_digest is not None:
        _pull(backend, pin, settings, progress)
        source = "pulled"
        info = backend.inspect_image(pin.lookup)
    if info is None:
        raise ImageUnavailable(
            f"the image {pin.reference} is not present on this host"
            + (" and a bundle did not provide it" if bundle else ""),
            hint="an image id pin needs the image here: build it, `runner image load` its "
            "bundle, or pass --bundle; a name@sha256 pin is pulled from its registry",
        )
    if source == "bundle":
        if info.id != pin.image_id:
            raise ImageDigestMismatch(f"the bundle loaded {info.id}, not {pin.image_id}")
        repo_digest = None  # a loaded bundle has no repo digest; the image id is the pin
    else:
        repo_digest = verify(pin, info)
    host = normalize_arch(backend.architecture())
    if host and info.architecture and normalize_arch(info.architecture) != host:
        raise PolicyViolation(
            f"the image {info.id} is built for {info.os}/{info.architecture}; this host is {host}",
            hint=f"pin the image's {host} variant (its own manifest digest)",
        )
    return Acquired(info, source, repo_digest)
