"""The issuer's side: make a signing key, pin a local image and the inputs' digests into a
contract, stamp and sign a contract into a DSSE envelope.

Library functions: each takes paths and values, writes its files, returns what it wrote, and
raises a :class:`~runner.core.errors.RunnerError` subclass when it refuses. ``runner keygen``,
``runner pin`` and ``runner sign`` (runner/cli/issuer.py) print what they return.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from runner.core import units
from runner.core.errors import ContractError, ImageUnavailable, RefusedError
from runner.core.units import BadDuration as BadDuration  # raised by sign, caught by the CLI

__all__ = ["BadDuration", "keygen", "parse_duration", "pin", "sign"]


@dataclass(frozen=True)
class KeyPair:
    """What :func:`keygen` wrote."""

    key_id: str
    private_key: Path
    public_key: Path


@dataclass(frozen=True)
class Pinned:
    """What :func:`pin` wrote: the contract, the image it now pins (None: not asked), the
    digests of its inputs and the listings file of its folder inputs."""

    contract: Path
    image: str | None
    image_id: str | None
    contract_digest: str
    inputs: dict[str, str]
    """``$.paper.digest`` / ``$.repository.digest`` → the digest bound."""
    listings: Path | None


@dataclass(frozen=True)
class Signed:
    """What :func:`sign` wrote: the envelope, and what it stamped into the contract."""

    envelope: Path
    key_id: str
    contract_digest: str
    issued_at: str | None
    expires_at: str | None
    audience: list[str] | None
    job_id: str | None
    inputs: dict[str, str]
    """``$.paper.digest`` / ``$.repository.digest`` → the digest bound."""
    listings: Path | None


MAX_LIFETIME_SECONDS = 3650 * 86400
"""Ten years: the longest lifetime ``--expires-in`` takes (a host policy may allow less)."""


def parse_duration(text: str) -> timedelta:
    """A lifetime: a duration (:mod:`runner.core.units`: ``90s``, ``30m``, ``24h``, ``7d``, a
    number of seconds) more than 0 and at most :data:`MAX_LIFETIME_SECONDS`."""
    try:
        seconds = units.parse_seconds(text)
    except BadDuration as exc:
        raise BadDuration(f"a lifetime is {units.DURATION_FORMS}; got {text!r}") from exc
    if not 0 < seconds <= MAX_LIFETIME_SECONDS:
        raise BadDuration(
            f"a lifetime is more than 0 and at most {MAX_LIFETIME_SECONDS // 86400} days "
            f"(e.g. 90s, 30m, 24h, 7d); got {text!r}"
        )
    return timedelta(seconds=seconds)


def keygen(prefix: Path) -> KeyPair:
    """Write ``PREFIX.key`` (PKCS#8 PEM, mode 0600) and ``PREFIX.pub``; never overwrites."""
    from runner.trust import signing

    private = prefix.with_name(prefix.name + ".key")
    public = prefix.with_name(prefix.name + ".pub")
    for path in (private, public):
        if path.exists():
            raise RefusedError(
                f"{path} already exists; keygen never overwrites a key",
                hint="choose another --out, or remove the old pair on purpose",
            )
    return KeyPair(signing.generate_key(private, public), private, public)


def read_contract(path: Path) -> dict[str, Any]:
    """An issuer's contract as JSON, before its digest is (re)computed."""
    from runner.contract import parse_json

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ContractError(f"cannot read {path}: {exc.strerror}", hint="check the path") from exc
    return parse_json(raw, str(path))


def bind_inputs(
    data: dict[str, Any], folder: Path, contract_name: str, *, repin: bool
) -> tuple[dict[str, str], dict[str, str]]:
    """Fill in ``paper.digest``, ``repository.digest`` and ``agent.promptDigest`` from the inputs
    in ``folder`` (read as
    the runner stages them). A digest already there is kept when the input still hashes to it,
    and refused (:class:`~runner.core.errors.InputDigestMismatch`, naming the first differing path
    from the listings file beside the contract) when it does not, unless ``repin``. Returns the
    digests bound and the listings of the folder inputs, by field."""
    from runner.staging import inputs
    from runner.staging import jobdir as staging

    digests: dict[str, str] = {}
    listings: dict[str, str] = {}
    for name, path_key, digest_key in (
        ("paper", "path", "digest"),
        ("repository", "path", "digest"),
        ("agent", "promptPath", "promptDigest"),
    ):
        obj = data.get(name)
        if not isinstance(obj, dict) or not isinstance(obj.get(path_key), str):
            continue
        field = f"$.{name}.{path_key}"
        got = staging.hash_input(folder, field, obj[path_key])
        present = obj.get(digest_key)
        if present is not None and present != got.digest and not repin:
            raise inputs.mismatch(
                field, got.path, str(present), got.digest, got.entries, folder, contract_name
            )
        obj[digest_key] = got.digest
        digests[f"$.{name}.{digest_key}"] = got.digest
        if got.entries is not None:
            listings[field] = inputs.listing(got.entries.values())
    return digests, listings


def _write_listings(beside: Path, listings: dict[str, str]) -> Path | None:
    """``<stem>.inputs.json`` beside the contract ``beside`` (None: no folder input)."""
    from runner.staging import inputs
    from runner.state.jobdir import atomic_write

    if not listings:
        return None
    path = beside.with_name(inputs.listings_name(beside.name))
    atomic_write(path, inputs.listings_document(listings))
    return path


def pin(
    contract: Path,
    image: str | None = None,
    *,
    output: Path | None = None,
    note: Callable[[str], None] = lambda line: None,
) -> Pinned:
    """Pin the inputs of ``contract`` (``paper.digest``, ``repository.digest``, recomputed from
    its folder; their listings go to ``<stem>.inputs.json`` beside the output) and, when given,
    the local image ``image``: its manifest digest (when it has one for that repository) or its
    image id into ``environment.image``, its id into ``environment.imageId``. Recompute
    ``contractDigest``, verify, and write the contract to ``output`` (default: over
    ``contract``). ``note`` hears about an ``output`` in another folder, whose relative input
    paths then resolve from there."""
    from runner.contract import verify_data, with_digest

    data = read_contract(contract)
    folder = contract.resolve().parent
    image_ref = image_id = None
    if image is not None:
        image_ref, image_id = _pin_image(data, image)
    digests, listings = bind_inputs(data, folder, contract.name, repin=True)
    pinned = with_digest(data)
    text = json.dumps(pinned, indent=2, ensure_ascii=False) + "\n"
    out = output if output is not None else contract
    verify_data(pinned, text.encode(), folder, str(out))
    if out.resolve().parent != folder:
        note(f"{out} is not beside {contract}; its relative input paths resolve from {out.parent}")
    out.write_text(text, encoding="utf-8")
    written = _write_listings(out, listings)
    return Pinned(out, image_ref, image_id, pinned["contractDigest"], digests, written)


def _pin_image(data: dict[str, Any], image: str) -> tuple[str, str]:
    """Write the local image's pin into ``data``; ``(environment.image, its id)``."""
    from runner import backends
    from runner.images.pins import repository_of

    info = backends.default().inspect_image(image)
    if info is None:
        raise ImageUnavailable(
            f"no local image {image!r} to pin",
            hint="build it first (scripts/setup.sh builds runner-cpu:local) or `docker load` it",
        )
    env = data.get("environment")
    if not isinstance(env, dict):
        raise ContractError("must be an object to pin an image into", path="$.environment")
    name = repository_of(image.split("@", 1)[0])
    digests = [d for d in info.repo_digests if d.split("@", 1)[0] == name]
    env["image"] = digests[0] if digests else info.id
    env["imageId"] = info.id
    return env["image"], info.id


def sign(
    contract: Path,
    key: Path,
    *,
    expires_in: timedelta | str | None = "24h",
    audience: list[str] | None = None,
    job_id: str | None = None,
    output: Path | None = None,
    repin_inputs: bool = False,
) -> Signed:
    """Stamp ``issuedAt`` (now) and ``expiresAt`` (now + ``expires_in``; None keeps the
    contract's own times), ``audience`` and ``jobId`` when given; bind the inputs
    (:func:`bind_inputs`: digests filled in, or checked, or with ``repin_inputs`` recomputed;
    their listings beside the envelope); recompute ``contractDigest``, verify, and sign the
    exact contract bytes with ``key`` into a DSSE envelope written to ``output`` (default:
    ``contract`` with ``.dsse.json``). A malformed ``expires_in`` string raises
    :class:`BadDuration`."""
    from runner.contract import verify_data, with_digest
    from runner.contract.load import is_envelope
    from runner.trust import signing

    data = read_contract(contract)
    if is_envelope(data):
        raise RefusedError(
            f"{contract} is already a signed envelope", hint="sign the bare contract"
        )
    now = datetime.now(UTC).replace(microsecond=0)
    if expires_in is not None:
        lifetime = parse_duration(expires_in) if isinstance(expires_in, str) else expires_in
        data["issuedAt"] = now.isoformat().replace("+00:00", "Z")
        data["expiresAt"] = (now + lifetime).isoformat().replace("+00:00", "Z")
    if audience:
        data["audience"] = audience
    if job_id:
        data["jobId"] = job_id
    folder = contract.resolve().parent
    digests, listings = bind_inputs(data, folder, contract.name, repin=repin_inputs)
    stamped = with_digest(data)
    payload = (json.dumps(stamped, indent=2, ensure_ascii=False) + "\n").encode()
    verify_data(stamped, payload, folder, str(contract))  # schema, digest...
    private = signing.load_private_key(key)
    envelope = signing.sign(payload, private)
    out = output if output is not None else contract.with_name(contract.stem + ".dsse.json")
    out.write_text(signing.dumps_envelope(envelope))
    written = _write_listings(out, listings)
    return Signed(
        envelope=out,
        key_id=envelope["signatures"][0]["keyid"],
        contract_digest=stamped["contractDigest"],
        issued_at=stamped.get("issuedAt"),
        expires_at=stamped.get("expiresAt"),
        audience=stamped.get("audience"),
        job_id=stamped.get("jobId"),
        inputs=digests,
        listings=written,
    )
