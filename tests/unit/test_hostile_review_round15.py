"""The fifteenth hostile review (of the garbage collector held off while a command starts,
which found the envelope's signatures unbounded): a DSSE envelope of thousands of made-up
signatures had each tried against every trusted key over the whole payload, seconds of a
runner's CPU for each key it trusts (3,000 of them took 2.8 s against 3 keys)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from runner.core.errors import SignatureInvalid
from runner.trust import signing
from tests.unit.test_signing import Host, b64, contract_data, independent_envelope


def _padded(envelope: dict[str, Any], count: int) -> dict[str, Any]:
    """The envelope with made-up signatures after its real one, ``count`` in all."""
    fake = {"keyid": "made-up", "sig": b64(bytes(64))}
    return {**envelope, "signatures": [*envelope["signatures"], *[fake] * (count - 1)]}


def test_an_envelope_of_thousands_of_signatures_is_refused_before_any_is_tried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    issuer = Ed25519PrivateKey.generate()
    trusted = [
        signing.TrustedKey(signing.key_id(k.public_key()), k.public_key(), "k")
        for k in (issuer, *(Ed25519PrivateKey.generate() for _ in range(2)))
    ]
    envelope = _padded(independent_envelope(contract_data(), issuer), 40_000)
    tried = 0
    real = signing.TrustedKey.named_by

    def counted(self: signing.TrustedKey, hint: object) -> bool:
        nonlocal tried
        tried += 1
        return real(self, hint)

    monkeypatch.setattr(signing.TrustedKey, "named_by", counted)
    t = time.process_time()
    with pytest.raises(SignatureInvalid) as refused:
        signing.verify_envelope(envelope, trusted, 1)
    assert time.process_time() - t < 1.0  # the loop alone took seconds
    assert tried == 0
    assert "carries 40000 signatures; at most 16 are read" in refused.value.message
    assert "signatureThreshold" in (refused.value.hint or "")


def test_up_to_the_cap_or_the_threshold_still_verifies() -> None:
    issuer = Ed25519PrivateKey.generate()
    trusted = [signing.TrustedKey(signing.key_id(issuer.public_key()), issuer.public_key(), "k")]
    envelope = independent_envelope(contract_data(), issuer)
    assert signing.verify_envelope(_padded(envelope, signing.MAX_SIGNATURES), trusted, 1)
    with pytest.raises(SignatureInvalid, match="at most 16 are read"):
        signing.verify_envelope(_padded(envelope, signing.MAX_SIGNATURES + 1), trusted, 1)
    # A host whose policy asks for more signers than the cap reads as many as it asks for.
    with pytest.raises(SignatureInvalid, match="1 distinct trusted key"):
        signing.verify_envelope(_padded(envelope, 20), trusted, 20)


def test_runner_verify_says_so_with_the_fix(tmp_path: Any) -> None:
    issuer = Ed25519PrivateKey.generate()
    host = Host(tmp_path / "host")
    host.trust(issuer)
    code, _, err = host.verify(_padded(independent_envelope(contract_data(), issuer), 5_000))
    assert code == 3
    assert "signature_invalid" in err
    assert "carries 5000 signatures; at most 16 are read" in err
    assert "fix:" in err
