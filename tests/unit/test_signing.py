"""Signed contracts (DSSE, Ed25519) and the host policy: each refusal, and round trips with an
independent signer and verifier written here from the DSSE spec with `cryptography` alone."""

from __future__ import annotations

import base64
import hashlib
import json
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from runner.contract import load_contract, with_digest
from runner.core.errors import PolicyViolation
from runner.planning import plan
from runner.trust import signing
from tests.support import contract_data, copy_toy_inputs, run_cli

PAYLOAD_TYPE = "application/vnd.citeark.execution-contract+json"


def independent_pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 PAE, written from the spec (not imported from the runner)."""
    t = payload_type.encode()
    return b"DSSEv1 " + b" ".join([str(len(t)).encode(), t, str(len(payload)).encode(), payload])


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def raw_keyid(public: Ed25519PublicKey) -> str:
    """The runner's earlier key id form: still accepted as a signature's hint."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def default_keyid(public: Ed25519PublicKey) -> str:
    """securesystemslib's default key id, written out here: SHA-256 of the canonical JSON of
    its key dict (test_interop checks it against securesystemslib itself)."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    canonical = '{"keytype":"ed25519","keyval":{"public":"' + raw.hex() + '"},"scheme":"ed25519"}'
    return hashlib.sha256(canonical.encode()).hexdigest()


def write_public(public: Ed25519PublicKey, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return path


def independent_envelope(
    data: dict[str, Any],
    key: Ed25519PrivateKey,
    *,
    payload_type: str = PAYLOAD_TYPE,
    keyid: str | None = None,
) -> dict[str, Any]:
    payload = json.dumps(data, indent=2).encode()
    sig = key.sign(independent_pae(payload_type, payload))
    return {
        "payloadType": payload_type,
        "payload": b64(payload),
        "signatures": [{"keyid": keyid or raw_keyid(key.public_key()), "sig": b64(sig)}],
    }


class Host:
    """A host configuration in a temp folder: trusted keys and an optional policy file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.keys = root / "trusted"
        self.keys.mkdir(parents=True)
        self.policy: Path | None = None

    def trust(self, key: Ed25519PrivateKey, name: str = "issuer") -> None:
        write_public(key.public_key(), self.keys / f"{name}.pub")

    def set_policy(self, **policy: Any) -> None:
        self.policy = self.root / "policy.json"
        self.policy.write_text(json.dumps(policy))

    def args(self) -> list[str]:
        out = ["--trusted-keys", str(self.keys)]
        if self.policy:
            out += ["--policy", str(self.policy)]
        return out

    def verify(self, envelope: dict[str, Any] | str, *extra: str) -> tuple[int, str, str]:
        path = self.root / "task.dsse.json"
        path.write_text(envelope if isinstance(envelope, str) else json.dumps(envelope))
        proc = run_cli("verify", str(path), *self.args(), *extra)
        return proc.returncode, proc.stdout, proc.stderr

    def run(self, envelope: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """`runner run --json` of the envelope: refused before anything is staged or run."""
        path = self.root / "task.dsse.json"
        path.write_text(json.dumps(envelope))
        state = self.root / "state"
        proc = run_cli("run", str(path), "--json", "--state-dir", str(state), *self.args())
        assert not (state / "jobs").exists(), "a refused contract must not be staged"
        return proc.returncode, json.loads(proc.stdout)


@pytest.fixture
def issuer() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def host(tmp_path: Path, issuer: Ed25519PrivateKey) -> Host:
    h = Host(tmp_path / "host")
    h.trust(issuer)
    return h


def test_pae_matches_the_published_dsse_vector() -> None:
    expected = b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    assert signing.pae("http://example.com/HelloWorld", b"hello world") == expected
    assert independent_pae("http://example.com/HelloWorld", b"hello world") == expected


def test_independently_signed_envelope_verifies(host: Host, issuer: Ed25519PrivateKey) -> None:
    """An envelope built here from the spec, its signature naming the key in the runner's
    earlier key id form, verifies with `runner verify`, which names the signer by the key id
    it computed itself."""
    code, out, err = host.verify(independent_envelope(contract_data(), issuer))
    assert code == 0, err
    assert default_keyid(issuer.public_key()) in out
    assert "signature       verified" in out


def test_runner_sign_verifies_independently(tmp_path: Path) -> None:
    """`runner keygen` + `runner sign` produce an envelope that an independent Ed25519 check
    over the PAE accepts; the payload is exactly the signed contract."""
    proc = run_cli("keygen", "--out", str(tmp_path / "issuer"), "--json")
    assert proc.returncode == 0, proc.stderr
    made = json.loads(proc.stdout)
    private = tmp_path / "issuer.key"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    contract = copy_toy_inputs(tmp_path) / "task.json"
    contract.write_text(json.dumps(contract_data(issuedAt=None, expiresAt=None)))
    proc = run_cli(
        "sign",
        str(contract),
        "--key",
        str(private),
        "--audience",
        "lab-a",
        "--expires-in",
        "2h",
        "--job-id",
        "signed-job-1",
    )
    assert proc.returncode == 0, proc.stderr
    envelope = json.loads((tmp_path / "task.dsse.json").read_text())
    assert envelope["payloadType"] == PAYLOAD_TYPE
    payload = base64.b64decode(envelope["payload"])
    public = serialization.load_pem_public_key((tmp_path / "issuer.pub").read_bytes())
    assert isinstance(public, Ed25519PublicKey)
    (sig,) = envelope["signatures"]
    public.verify(base64.b64decode(sig["sig"]), independent_pae(PAYLOAD_TYPE, payload))
    assert sig["keyid"] == made["keyId"] == default_keyid(public)
    signed = json.loads(payload)
    assert signed["audience"] == ["lab-a"] and signed["jobId"] == "signed-job-1"
    lifetime = datetime.fromisoformat(signed["expiresAt"]) - datetime.fromisoformat(
        signed["issuedAt"]
    )
    assert lifetime == timedelta(hours=2)
    assert with_digest(signed)["contractDigest"] == signed["contractDigest"]
    # keygen never overwrites a key.
    again = run_cli("keygen", "--out", str(tmp_path / "issuer"))
    assert again.returncode == 3 and "already exists" in again.stderr


def _tampered(envelope: dict[str, Any]) -> dict[str, Any]:
    payload = base64.b64decode(envelope["payload"]).replace(b'"cpus": 1', b'"cpus": 2')
    return {**envelope, "payload": b64(payload)}


REFUSALS = {
    "tampered payload": ("signature_invalid", "distinct trusted key"),
    "swapped payloadType": ("signature_invalid", "payloadType"),
    "untrusted key": ("signature_invalid", "0 distinct trusted key"),
    "keyid of a trusted key, bytes of another": ("signature_invalid", "0 distinct trusted key"),
    "non-base64 payload": ("signature_invalid", "not valid base64"),
    "truncated envelope": ("invalid_contract", "not valid JSON"),
    "expired": ("policy_violation", "$.expiresAt"),
    "not yet valid": ("policy_violation", "$.issuedAt"),
    "too long a lifetime": ("policy_violation", "$.expiresAt"),
    "signed without expiry": ("policy_violation", "must say when it expires"),
    "another audience": ("policy_violation", "$.audience"),
    "cpus above the maximum": ("policy_violation", "$.environment.cpus"),
    "timeout above the maximum": ("policy_violation", "$.environment.timeoutMinutes"),
    "network asked": ("policy_violation", "$.environment.networkAccess"),
    "registry not allowed": ("policy_violation", "registry.example.org"),
    "gpus on a host without": ("policy_violation", "$.environment.gpu"),
}


def _case(name: str, issuer: Ed25519PrivateKey, host: Host) -> dict[str, Any] | str:
    other = Ed25519PrivateKey.generate()
    good = independent_envelope(contract_data(), issuer)
    past = datetime.now(UTC) - timedelta(days=2)
    if name == "tampered payload":
        return _tampered(good)
    if name == "swapped payloadType":
        data = contract_data()
        return independent_envelope(data, issuer, payload_type="application/vnd.in-toto+json")
    if name == "untrusted key":
        return independent_envelope(contract_data(), other)
    if name == "keyid of a trusted key, bytes of another":
        return independent_envelope(contract_data(), other, keyid=raw_keyid(issuer.public_key()))
    if name == "non-base64 payload":
        return {**good, "payload": good["payload"][:-3] + "!!!"}
    if name == "truncated envelope":
        return json.dumps(good)[: len(json.dumps(good)) // 2]
    if name == "expired":
        data = contract_data(
            issuedAt=past.isoformat(), expiresAt=(past + timedelta(hours=1)).isoformat()
        )
        return independent_envelope(data, issuer)
    if name == "not yet valid":
        soon = datetime.now(UTC) + timedelta(hours=3)
        data = contract_data(
            issuedAt=soon.isoformat(), expiresAt=(soon + timedelta(hours=1)).isoformat()
        )
        return independent_envelope(data, issuer)
    if name == "too long a lifetime":
        data = contract_data(expiresAt=(datetime.now(UTC) + timedelta(days=400)).isoformat())
        return independent_envelope(data, issuer)
    if name == "signed without expiry":
        return independent_envelope(contract_data(expiresAt=None), issuer)
    if name == "another audience":
        host.set_policy(audiences=["lab-a"])
        return independent_envelope(contract_data(audience=["lab-b"]), issuer)
    if name == "cpus above the maximum":
        host.set_policy(maxima={"cpus": 0.5})
        return good
    if name == "timeout above the maximum":
        host.set_policy(maxima={"timeoutMinutes": 5})
        return good
    if name == "network asked":
        return independent_envelope(contract_data(env_networkAccess=True), issuer)
    if name == "registry not allowed":
        host.set_policy(allowedRegistries=["localhost:5000"])
        image = "registry.example.org/lab/eval@sha256:" + "cd" * 32
        return independent_envelope(contract_data(env_image=image), issuer)
    if name == "gpus on a host without":
        host.set_policy(maxima={"gpus": 0})
        data = contract_data(env_gpu=1)
        data["computeRequirement"]["cpuFallbackAllowed"] = False
        return independent_envelope(with_digest(data), issuer)
    raise AssertionError(name)


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_refusals_name_category_field_and_fix(
    name: str, host: Host, issuer: Ed25519PrivateKey
) -> None:
    """Each bad contract is refused (exit 3) by verify and by run, before anything is staged,
    with its category, the field or cause, and a fix."""
    category, needle = REFUSALS[name]
    envelope = _case(name, issuer, host)
    code, _, err = host.verify(envelope)
    assert code == 3, err
    assert f"runner: {category}:" in err
    assert needle in err
    assert "fix:" in err
    if isinstance(envelope, dict):
        code, result = host.run(envelope)
        assert code == 3
        assert result["status"] == "failed"
        assert result["failure"]["category"] == category
        assert result["exitCode"] is None and result["container"] is None


def test_policy_violation_names_value_and_maximum(host: Host, issuer: Ed25519PrivateKey) -> None:
    host.set_policy(maxima={"memoryGb": 0.25})
    code, _, err = host.verify(independent_envelope(contract_data(), issuer))
    assert code == 3
    assert "$.environment.memoryGb: the contract asks for 0.5, this host allows at most 0.25" in err


def test_unsigned_contract_is_refused_by_default(tmp_path: Path) -> None:
    path = tmp_path / "task.json"
    path.write_text(json.dumps(contract_data()))
    proc = run_cli("verify", str(path))
    assert proc.returncode == 3
    assert "signature_invalid" in proc.stderr and "--allow-unsigned" in proc.stderr
    allowed = run_cli("verify", str(path), "--allow-unsigned")
    assert allowed.returncode == 0, allowed.stderr
    assert "none (unsigned" in allowed.stdout


def test_one_key_under_two_ids_counts_once(host: Host, issuer: Ed25519PrivateKey) -> None:
    """A threshold of two is not met by one key listed twice under two key ids."""
    host.trust(issuer, name="same-key-again")
    host.set_policy(signatureThreshold=2)
    envelope = independent_envelope(contract_data(), issuer, keyid="first-id")
    envelope["signatures"].append({**envelope["signatures"][0], "keyid": "second-id"})
    code, _, err = host.verify(envelope)
    assert code == 3
    assert "1 distinct trusted key(s) verified, the policy needs 2" in err


def test_threshold_of_two_distinct_keys_passes(host: Host, issuer: Ed25519PrivateKey) -> None:
    second = Ed25519PrivateKey.generate()
    host.trust(second, name="second")
    host.set_policy(signatureThreshold=2)
    data = contract_data()
    one = independent_envelope(data, issuer)
    two = independent_envelope(data, second)
    assert one["payload"] == two["payload"]
    one["signatures"] += two["signatures"]
    code, out, err = host.verify(one)
    assert code == 0, err
    assert default_keyid(second.public_key()) in out


def test_keys_inside_the_envelope_are_never_used(host: Host, issuer: Ed25519PrivateKey) -> None:
    """Extra fields (such as a key shipped inside the envelope) are refused, not trusted."""
    envelope = independent_envelope(contract_data(), Ed25519PrivateKey.generate())
    envelope["publicKey"] = "an attacker's key"
    code, _, err = host.verify(envelope)
    assert code == 3 and "unknown fields" in err


def test_limit_overrides_only_tighten(tmp_path: Path) -> None:
    path = tmp_path / "task.json"
    path.write_text(json.dumps(contract_data()))
    contract = load_contract(path)
    assert plan.tightened(contract, {"cpus": 0.5})["cpus"] == 0.5
    with pytest.raises(PolicyViolation, match="would loosen the contract's 1"):
        plan.tightened(contract, {"cpus": 2})
    with pytest.raises(PolicyViolation, match="not a limit"):
        plan.tightened(contract, {"gpu": 0})


def test_bad_policy_file_names_the_field(tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"maxima": {"cpus": -1}}))
    path = tmp_path / "task.json"
    path.write_text(json.dumps(contract_data()))
    proc = run_cli("verify", str(path), "--policy", str(policy), "--allow-unsigned")
    assert proc.returncode == 4  # the host's own configuration is broken: infrastructure
    assert "$.maxima.cpus" in proc.stderr
