"""DSSE envelopes with Ed25519 keys: signing contracts and verifying them against trusted keys.

The envelope is ``{"payloadType", "payload", "signatures": [{"keyid", "sig"}]}`` with the
payload the exact contract bytes (base64). A signature is over the DSSE pre-authentication
encoding ``PAE(payloadType, payload)``. Verification follows the DSSE rules:

- the ``keyid`` in a signature is a hint only: every trusted key may be tried, and the key id
  recorded is the one recomputed from the trusted key's own bytes;
- a key's id is securesystemslib's default one (:func:`key_id`), so that its DSSE verifier,
  which only tries a key whose id equals the signature's ``keyid``, accepts what the runner
  signs with its defaults; the runner's earlier form (:func:`raw_key_id`) is still recognised
  as a hint;
- the threshold counts distinct keys (one key listed twice, or signing twice, counts once);
- ``payloadType`` must be the contract type;
- the payload is parsed only from the bytes that verified.

The Ed25519 arithmetic comes from ``cryptography``; this module only arranges bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from runner.core.errors import HostConfigError, RunnerError, SignatureInvalid

__all__ = [
    "MAX_SIGNATURES",
    "PAYLOAD_TYPE",
    "TrustedKey",
    "_b64",
    "dumps_envelope",
    "generate_key",
    "key_id",
    "load_private_key",
    "load_public_key",
    "load_trusted_keys",
    "pae",
    "sign",
    "verify_envelope",
]

PAYLOAD_TYPE = "application/vnd.citeark.execution-contract+json"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(t), t, len(payload), payload)


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public: Ed25519PublicKey) -> str:
    """The key's id as securesystemslib computes it by default (``SSlibKey.from_crypto``): the
    hex SHA-256 of the canonical JSON of ``{"keytype": "ed25519", "keyval": {"public": <hex of
    the raw key>}, "scheme": "ed25519"}``. Computed, never read from a signature.

    Canonical JSON here is sorted keys and no whitespace; every value is a plain ASCII string
    (names and hex), so ``json.dumps`` writes exactly the canonical bytes."""
    key = {"keytype": "ed25519", "keyval": {"public": _raw(public).hex()}, "scheme": "ed25519"}
    canonical = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def raw_key_id(public: Ed25519PublicKey) -> str:
    """The runner's earlier key id, ``sha256:`` + hex SHA-256 of the raw 32-byte public key:
    what signatures made before the change name; still taken as a hint for this key."""
    return "sha256:" + hashlib.sha256(_raw(public)).hexdigest()


@dataclass(frozen=True)
class TrustedKey:
    keyid: str
    public: Ed25519PublicKey
    source: str

    def named_by(self, hint: object) -> bool:
        """Whether a signature's ``keyid`` names this key, in either form."""
        return hint in (self.keyid, raw_key_id(self.public))


def load_public_key(path: Path) -> TrustedKey:
    """An Ed25519 public key from a PEM file."""
    try:
        loaded = serialization.load_pem_public_key(path.read_bytes())
    except (ValueError, OSError) as exc:
        raise HostConfigError(
            f"{path} is not a readable PEM public key: {exc}",
            hint="trusted keys are the .pub files that `runner keygen` writes",
        ) from exc
    if not isinstance(loaded, Ed25519PublicKey):
        raise HostConfigError(
            f"{path} holds a {type(loaded).__name__}; only Ed25519 keys are trusted",
            hint="remove it from the trusted-keys folder, or trust an Ed25519 key that "
            "`runner keygen` made",
        )
    return TrustedKey(key_id(loaded), loaded, str(path))


def load_trusted_keys(folder: Path) -> list[TrustedKey]:
    """Every ``*.pub`` in ``folder`` (missing folder: no keys). Duplicates collapse by key id."""
    if not folder.is_dir():
        return []
    keys: dict[str, TrustedKey] = {}
    for path in sorted(folder.glob("*.pub")):
        key = load_public_key(path)
        keys.setdefault(key.keyid, key)
    return list(keys.values())


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError, OSError) as exc:
        raise RunnerError(
            f"{path} is not a readable unencrypted PEM private key: {exc}",
            hint="use the .key file that `runner keygen` wrote (PEM, unencrypted)",
        ) from exc
    if not isinstance(loaded, Ed25519PrivateKey):
        raise RunnerError(
            f"{path} holds a {type(loaded).__name__}; only Ed25519 keys are used",
            hint="make one with `runner keygen --out NAME`",
        )
    return loaded


def generate_key(private_path: Path, public_path: Path) -> str:
    """Write a new Ed25519 key pair (private key mode 0600); return its key id."""
    private = Ed25519PrivateKey.generate()
    private_pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    private_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private_pem)
    public_path.write_bytes(public_pem)
    return key_id(private.public_key())


def sign(
    payload: bytes, private: Ed25519PrivateKey, payload_type: str = PAYLOAD_TYPE
) -> dict[str, Any]:
    """A DSSE envelope over ``payload`` with one signature."""
    signature = private.sign(pae(payload_type, payload))
    return {
        "payloadType": payload_type,
        "payload": base64.b64encode(payload).decode("ascii"),
        "signatures": [
            {
                "keyid": key_id(private.public_key()),
                "sig": base64.b64encode(signature).decode("ascii"),
            }
        ],
    }


def _b64(value: Any, what: str) -> bytes:
    """Standard or URL-safe base64, padded or not (both are allowed by DSSE); strict."""
    if not isinstance(value, str) or not value:
        raise SignatureInvalid(f"{what} must be a non-empty base64 string")
    text = value.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SignatureInvalid(
            f"{what} is not valid base64 (truncated or corrupted envelope?): {exc}",
            hint="re-download the envelope, or re-sign the contract with `runner sign`",
        ) from exc


MAX_SIGNATURES = 16
"""The most signatures an envelope may carry (or the host's threshold, when that is more).
Each one is tried against every trusted key, over the whole payload: a hostile envelope of
thousands of made-up signatures (a contract's 4 MiB holds about 40,000) would hold the
runner for seconds for each trusted key, where a signer has no use for more than a few."""


@dataclass(frozen=True)
class VerifiedPayload:
    payload: bytes
    payload_type: str
    keyids: tuple[str, ...]
    """Key ids (recomputed from the trusted keys) whose signatures verified."""


def verify_envelope(
    envelope: dict[str, Any],
    trusted: list[TrustedKey],
    threshold: int,
    payload_type: str = PAYLOAD_TYPE,
) -> VerifiedPayload:
    """Verify a DSSE envelope; return the payload bytes that verified, or raise
    :class:`SignatureInvalid` saying why."""
    unknown = set(envelope) - {"payloadType", "payload", "signatures"}
    if unknown:
        raise SignatureInvalid(f"the envelope has unknown fields: {', '.join(sorted(unknown))}")
    found = envelope.get("payloadType")
    if found != payload_type:
        raise SignatureInvalid(
            f"payloadType is {found!r}, expected {payload_type!r}",
            hint="only envelopes of that type (signed with `runner sign`, or by a runner) "
            "are accepted",
        )
    payload = _b64(envelope.get("payload"), "payload")
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or not signatures:
        raise SignatureInvalid("the envelope has no signatures")
    most = max(MAX_SIGNATURES, threshold)
    if len(signatures) > most:
        raise SignatureInvalid(
            f"the envelope carries {len(signatures)} signatures; at most {most} are read",
            hint="sign with the keys the verifying host trusts, as many as its "
            "signatureThreshold asks for, and no others",
        )
    if not trusted:
        raise SignatureInvalid(
            "no trusted keys are configured on this host",
            hint="put the issuer's .pub file in the trusted-keys folder (`runner trust KEY.pub`)",
        )
    message = pae(payload_type, payload)
    verified: dict[str, TrustedKey] = {}
    for i, entry in enumerate(signatures):
        if not isinstance(entry, dict):
            raise SignatureInvalid(f"signatures[{i}] must be an object")
        sig = _b64(entry.get("sig"), f"signatures[{i}].sig")
        hint = entry.get("keyid")
        # The keyid is only a hint for which key to try first; every trusted key is tried.
        ordered = sorted(trusted, key=lambda k: not k.named_by(hint))
        for key in ordered:
            try:
                key.public.verify(sig, message)
            except InvalidSignature:
                continue
            verified[key.keyid] = key
            break
    if len(verified) < threshold:
        hints = sorted({str(s.get("keyid")) for s in signatures if isinstance(s, dict)})
        raise SignatureInvalid(
            f"{len(verified)} distinct trusted key(s) verified, the policy needs {threshold} "
            f"(signatures name key ids {', '.join(hints)})",
            hint="sign with a key this host trusts, or trust the issuer's key "
            "(`runner trust KEY.pub`); tampered payloads never verify",
        )
    return VerifiedPayload(payload, payload_type, tuple(sorted(verified)))


def dumps_envelope(envelope: dict[str, Any]) -> str:
    return json.dumps(envelope, indent=2) + "\n"
