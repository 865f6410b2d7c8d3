"""Interoperability, both ways, with the reference implementations: securesystemslib (its DSSE
``Envelope``, ``SSlibKey`` and ``CryptoSigner``, with their defaults) and the in-toto
attestation Python bindings (Statement v1, SLSA Provenance v1, ResourceDescriptor).

- contracts signed by `runner sign` verify with securesystemslib's default key ids, and
  contracts signed by securesystemslib verify with `runner verify` once `runner trust` trusts
  the key;
- results signed by the runner verify with securesystemslib and parse with the bindings (the
  envelope predicate against its own JSON Schema), and results signed by securesystemslib,
  their statements re-encoded by the bindings, verify with `runner verify-result`;
- `runner verify-result` takes a job folder, result.json or either statement, says which file
  it needs when given another, and trusts this host's runner key by default (saying so).

The jobs here run on the in-memory fake backend (no engine); the same statements come from
real runs in test_results and test_bundle.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from google.protobuf import json_format
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
from in_toto_attestation.v1.statement import Statement
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import CryptoSigner, SSlibKey

from runner.app import issuer
from runner.backends.fake import FakeBackend, FakeJob
from runner.contract import Trust
from runner.execution import orchestrator
from runner.planning import policy
from runner.results import attest
from runner.trust import signing
from tests.support import ROOT, contract_data, copy_toy_inputs, run_cli

CONTRACT_TYPE = "application/vnd.citeark.execution-contract+json"
STATEMENT_TYPE = "application/vnd.in-toto+json"


def _pem(public: Ed25519PublicKey, path: Path) -> Path:
    path.write_bytes(
        public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return path


def _public(path: Path) -> Ed25519PublicKey:
    loaded = serialization.load_pem_public_key(path.read_bytes())
    assert isinstance(loaded, Ed25519PublicKey)
    return loaded


def _sslib_signer(tmp_path: Path, name: str) -> tuple[CryptoSigner, Path]:
    """A securesystemslib signer of its own making (its key, its key id), and its public key
    as the PEM file a host is given."""
    signer = CryptoSigner.generate_ed25519()
    raw = bytes.fromhex(signer.public_key.keyval["public"])
    return signer, _pem(Ed25519PublicKey.from_public_bytes(raw), tmp_path / f"{name}.pub")


class _Quiet:
    def stage(self, name: str, detail: str) -> None:
        pass

    def running(self, elapsed: float, budget: float) -> None:
        pass

    def transfer(self, label: str, done: int, total: int) -> None:
        pass


def _write_evidence(mounts: dict[str, Path]) -> None:
    target = mounts["/job/output"] / "logs" / "evaluation.log"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text('{"accuracy": 0.819}\n')


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """This host's config folder (its runner key is made there on the first run)."""
    return tmp_path / "config"


@pytest.fixture
def job(tmp_path: Path, config: Path) -> Path:
    """A finished job, run on the fake backend from a contract signed with `runner sign`'s
    library, its result signed with this host's runner key (<config>/runner-key/runner.key)."""
    fake = FakeBackend(jobs=FakeJob(work=_write_evidence))
    image = fake.add_image()
    work = copy_toy_inputs(tmp_path / "issuer")
    contract = work / "task.json"
    contract.write_text(json.dumps(contract_data(env_image=image.id)))
    pair = issuer.keygen(work / "issuer")
    signed = issuer.sign(contract, pair.private_key, expires_in=timedelta(hours=1))
    loaded = policy.LoadedPolicy(policy.HostPolicy().resolved(), "test")
    options = orchestrator.RunOptions(
        state_dir=tmp_path / "state",
        policy=loaded,
        trust=Trust(keys=[signing.load_public_key(pair.public_key)]),
        tick_seconds=0.01,
        heartbeat_seconds=0.05,
        stop_grace_seconds=0.05,
        result_key=config / "runner-key" / "runner.key",
    )
    envelope = orchestrator.run(signed.envelope, options, backend=fake, progress=_Quiet())
    assert envelope.status == "succeeded", envelope.failure
    assert envelope.jobDir is not None
    return Path(envelope.jobDir)


def _runner_pub(config: Path) -> Path:
    return config / "runner-key" / "runner.pub"


def _payload(dsse_file: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        base64.b64decode(json.loads(dsse_file.read_text())["payload"])
    )
    return data


# -- key ids -------------------------------------------------------------------------------


def test_key_id_is_securesystemslibs_default(tmp_path: Path) -> None:
    """`runner keygen` prints, and the runner signs with, the key id securesystemslib computes
    for the same key by default; the earlier form is still a hint that names the key."""
    made = run_cli("keygen", "--out", str(tmp_path / "issuer"), "--json")
    assert made.returncode == 0, made.stderr
    public = _public(tmp_path / "issuer.pub")
    sslib_id = SSlibKey.from_crypto(public).keyid
    assert json.loads(made.stdout)["keyId"] == sslib_id
    private = signing.load_private_key(tmp_path / "issuer.key")
    assert CryptoSigner(private).public_key.keyid == sslib_id
    assert signing.key_id(public) == sslib_id
    key = signing.load_public_key(tmp_path / "issuer.pub")
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert key.named_by(sslib_id)
    assert key.named_by("sha256:" + hashlib.sha256(raw).hexdigest())
    assert not key.named_by("sha256:" + hashlib.sha256(b"another key").hexdigest())


# -- contracts -----------------------------------------------------------------------------


def test_runner_signed_contract_verifies_with_securesystemslib_defaults(tmp_path: Path) -> None:
    assert run_cli("keygen", "--out", str(tmp_path / "issuer")).returncode == 0
    contract = copy_toy_inputs(tmp_path) / "task.json"
    contract.write_text(json.dumps(contract_data(issuedAt=None, expiresAt=None)))
    proc = run_cli("sign", str(contract), "--key", str(tmp_path / "issuer.key"))
    assert proc.returncode == 0, proc.stderr
    signed = json.loads((tmp_path / "task.dsse.json").read_text())
    key = SSlibKey.from_crypto(_public(tmp_path / "issuer.pub"))  # its default key id

    accepted = Envelope.from_dict(json.loads(json.dumps(signed))).verify([key], 1)
    assert list(accepted) == [key.keyid]
    envelope = Envelope.from_dict(json.loads(json.dumps(signed)))
    assert envelope.payload_type == CONTRACT_TYPE
    assert json.loads(envelope.payload)["contractDigest"].startswith("sha256:")

    # A changed byte of the contract does not verify there either.
    tampered = {**signed, "payload": base64.b64encode(envelope.payload + b" ").decode()}
    with pytest.raises(VerificationError):
        Envelope.from_dict(tampered).verify([key], 1)


def test_securesystemslib_signed_contract_verifies_with_runner_verify(tmp_path: Path) -> None:
    """securesystemslib signs a contract with its own signer and key id; the host trusts the
    public key with `runner trust` and `runner verify` accepts it, naming that key id."""
    signer, public = _sslib_signer(tmp_path, "sslib-issuer")
    envelope = Envelope(
        payload=json.dumps(contract_data(), indent=2).encode(),
        payload_type=CONTRACT_TYPE,
        signatures={},
    )
    envelope.sign(signer)
    signed = tmp_path / "task.dsse.json"
    signed.write_text(json.dumps(envelope.to_dict()))
    trusted = tmp_path / "trusted-keys"

    refused = run_cli("verify", str(signed), "--trusted-keys", str(trusted))
    assert refused.returncode == 3 and "signature_invalid" in refused.stderr

    trust = run_cli("trust", str(public), "--trusted-keys", str(trusted), "--json")
    assert trust.returncode == 0, trust.stderr
    assert json.loads(trust.stdout)["keyId"] == signer.public_key.keyid
    proc = run_cli("verify", str(signed), "--trusted-keys", str(trusted), "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["signature"] == "verified" and info["signedBy"] == [signer.public_key.keyid]


# -- results -------------------------------------------------------------------------------


def _validate_statement(stmt: dict[str, Any]) -> Statement:
    """Statement v1 through the bindings: the proto refuses unknown fields and wrong types,
    ``validate`` what the spec requires (type, subjects with digests, a predicate)."""
    parsed = Statement.copy_from_pb(json_format.ParseDict(stmt, statement_pb2.Statement()))
    parsed.validate()
    return parsed


def _validate_provenance(predicate: dict[str, Any]) -> provenance_pb2.Provenance:
    """SLSA Provenance v1 through the bindings' proto (the spec's own schema, with the
    timestamps parsed as RFC 3339). The bindings have no ``validate`` for it and proto3 has no
    required fields: the fields SLSA requires are asserted here, from the spec."""
    pb = json_format.ParseDict(predicate, provenance_pb2.Provenance())
    assert pb.build_definition.build_type == attest.BUILD_TYPE
    assert pb.build_definition.HasField("external_parameters")
    assert pb.run_details.builder.id
    for rd in [*pb.build_definition.resolved_dependencies, *pb.run_details.byproducts]:
        ResourceDescriptor.copy_from_pb(rd).validate()
    return pb


def test_runner_signed_result_verifies_with_securesystemslib_and_the_bindings(
    job: Path, config: Path
) -> None:
    key = SSlibKey.from_crypto(_public(_runner_pub(config)))
    envelope = json.loads((job / "result.json").read_text())
    for name in (attest.STATEMENT_FILE, attest.ENVELOPE_STATEMENT_FILE):
        dsse = Envelope.from_dict(json.loads((job / name).read_text()))
        assert list(dsse.verify([key], 1)) == [key.keyid]
        assert dsse.payload_type == STATEMENT_TYPE
        _validate_statement(json.loads(dsse.payload))

    prov = _payload(job / attest.STATEMENT_FILE)
    assert prov["predicateType"] == "https://slsa.dev/provenance/v1"
    pb = _validate_provenance(prov["predicate"])
    subjects = {s["name"]: s["digest"]["sha256"] for s in prov["subject"]}
    assert subjects["result.json"] == hashlib.sha256((job / "result.json").read_bytes()).hexdigest()
    evidence = envelope["measurements"][0]["evidence"]
    assert subjects[f"output/{evidence['path']}"] == evidence["sha256"].removeprefix("sha256:")
    deps = {d.name: dict(d.digest) for d in pb.build_definition.resolved_dependencies}
    assert {m["name"]: m["digest"] for m in envelope["materials"]} == deps
    contract = next(name for name in deps if name.startswith("contract:"))
    assert deps[contract]["sha256"] == envelope["contractDigest"].removeprefix("sha256:")
    assert {n.split("/")[0] for n in deps} >= {"input", f"image:{envelope['image']['reference']}"}
    assert (
        pb.run_details.builder.id
        == f"https://github.com/citeark/runner@v{envelope['runnerVersion']}"
    )
    assert dict(pb.run_details.builder.version) == {"runner": envelope["runnerVersion"]}
    assert json_format.MessageToDict(pb.build_definition.external_parameters) == {
        "contract": {"name": envelope["contractName"], "digest": envelope["contractDigest"]},
        "jobId": envelope["jobId"],
    }
    assert pb.run_details.metadata.started_on.ToJsonString().startswith(
        envelope["timings"]["startedAt"][:19]
    )

    # The envelope statement: its predicate is result.json, valid against the published schema.
    stmt = _payload(job / attest.ENVELOPE_STATEMENT_FILE)
    assert stmt["predicateType"] == "https://github.com/citeark/runner/result-envelope/v1"
    assert stmt["predicate"] == envelope
    schema = json.loads((ROOT / "contracts" / "result-envelope.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(stmt["predicate"])

    # A changed value does not verify with securesystemslib.
    raw = json.loads((job / attest.ENVELOPE_STATEMENT_FILE).read_text())
    forged = base64.b64decode(raw["payload"]).replace(b"0.819", b"0.919")
    with pytest.raises(VerificationError):
        Envelope.from_dict({**raw, "payload": base64.b64encode(forged).decode()}).verify([key], 1)


def test_securesystemslib_signed_result_verifies_with_runner_verify_result(
    job: Path, tmp_path: Path
) -> None:
    """The runner's statements re-encoded by the bindings (protobuf's JSON, not the runner's
    bytes) and signed by securesystemslib verify with `runner verify-result` once the key is
    trusted with `runner trust`, and not before."""
    signer, public = _sslib_signer(tmp_path, "sslib-runner")
    for name in (attest.STATEMENT_FILE, attest.ENVELOPE_STATEMENT_FILE):
        parsed = _validate_statement(_payload(job / name))
        payload = json_format.MessageToJson(parsed.pb).encode()
        envelope = Envelope(payload=payload, payload_type=STATEMENT_TYPE, signatures={})
        envelope.sign(signer)
        (job / name).write_text(json.dumps(envelope.to_dict()))
    trusted = tmp_path / "trusted-runner-keys"
    trusted.mkdir()

    refused = run_cli("verify-result", str(job), "--result-keys", str(trusted))
    assert refused.returncode == 3 and "signature_invalid" in refused.stderr

    assert run_cli("trust", str(public), "--result-keys", str(trusted)).returncode == 0
    proc = run_cli("verify-result", str(job), "--result-keys", str(trusted), "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert [s["keyId"] for s in info["signedBy"]] == [signer.public_key.keyid]
    assert info["measurements"] == {"toy-accuracy": 0.819}
    assert info["subjectsChecked"] == info["subjects"] >= 1


# -- verify-result: what it takes, what it trusts -------------------------------------------


def test_verify_result_takes_the_folder_result_json_or_either_statement(
    job: Path, config: Path
) -> None:
    """On the host that made it, with no key named, this host's runner key is trusted, and
    the output says so; every way of naming the result checks the same files."""
    env = {"RUNNER_CONFIG_DIR": str(config)}
    for given in (
        job,
        job / "result.json",
        job / "result.intoto.json",
        job / "result.envelope.intoto.json",
    ):
        proc = run_cli("verify-result", str(given), env=env)
        assert proc.returncode == 0, (given, proc.stderr)
        assert f"(this host's runner key {_runner_pub(config)})" in proc.stdout
        assert "toy-accuracy = 0.819" in proc.stdout
        assert "result.intoto.json, result.envelope.intoto.json" in proc.stdout
        assert f"1 of 1 signed output files match {job / 'output'}" in proc.stdout


def test_an_auditor_elsewhere_names_the_key(job: Path, config: Path, tmp_path: Path) -> None:
    """Another host's runner key does not vouch for this result: it fails, saying what it
    trusted and how to name the producing host's key; naming it verifies."""
    elsewhere = tmp_path / "auditor-config"
    other = tmp_path / "other"
    assert run_cli("keygen", "--out", str(other)).returncode == 0
    (elsewhere / "runner-key").mkdir(parents=True)
    shutil.copy(other.with_suffix(".pub"), elsewhere / "runner-key" / "runner.pub")
    env = {"RUNNER_CONFIG_DIR": str(elsewhere)}
    refused = run_cli("verify-result", str(job), env=env)
    assert refused.returncode == 3
    assert "trusted by default: this host's own runner key" in refused.stderr
    assert "--key RUNNER.pub" in refused.stderr
    ok = run_cli("verify-result", str(job), "--key", str(_runner_pub(config)), "--json", env=env)
    assert ok.returncode == 0, ok.stderr
    info = json.loads(ok.stdout)
    assert info["trust"] == "the keys named"
    assert info["signedBy"][0]["trustedAs"] == f"--key {_runner_pub(config)}"
    # Naming keys means only those: this host's own key is then not trusted either.
    assert run_cli("verify-result", str(job), "--key", str(other.with_suffix(".pub")),
                   env={"RUNNER_CONFIG_DIR": str(config)}).returncode == 3  # fmt: skip


@pytest.mark.parametrize(
    ("given", "says", "fix"),
    [
        ("output", "is the job's output folder", "pass the job folder, {job}"),
        ("output/logs/evaluation.log", "a file the job wrote under output/", "{job}"),
        ("input/task.dsse.json", "is a signed contract, not a result", "runner verify"),
        ("input/task.json", "a file staged for the job under input/", "{job}"),
        ("toy.bag.tar.gz", "is an archive, not a result", "runner verify-bundle"),
        ("elsewhere", "holds no result", "its result.intoto.json"),
        ("missing.json", "does not exist", "its result.intoto.json"),
    ],
)
def test_verify_result_names_the_file_it_needs(
    job: Path, config: Path, tmp_path: Path, given: str, says: str, fix: str
) -> None:
    (job / "toy.bag.tar.gz").write_bytes(b"\x1f\x8b")
    (job / "elsewhere").mkdir()
    proc = run_cli(
        "verify-result", str(job / given), "--json", env={"RUNNER_CONFIG_DIR": str(config)}
    )
    assert proc.returncode == 3
    info = json.loads(proc.stdout)
    assert info["valid"] is False and says in info["error"], info
    assert fix.format(job=job) in info["hint"], info


def test_a_changed_result_json_or_a_missing_statement(job: Path, config: Path) -> None:
    env = {"RUNNER_CONFIG_DIR": str(config)}
    original = (job / "result.json").read_text()
    (job / "result.json").write_text(original.replace("0.819", "0.919"))
    proc = run_cli("verify-result", str(job), env=env)
    assert proc.returncode == 3
    assert "is not the result.json that" in proc.stderr and "signs" in proc.stderr
    (job / "result.json").write_text(original)
    (job / "result.intoto.json").unlink()
    proc = run_cli("verify-result", str(job / "result.json"), env=env)
    assert (
        proc.returncode == 3 and "no result.intoto.json: this result is not signed" in proc.stderr
    )


def test_a_result_signed_before_slsa_provenance_still_verifies(job: Path, config: Path) -> None:
    """A runner before this one wrote one statement, the envelope's, as result.intoto.json."""
    (job / "result.intoto.json").unlink()
    (job / "result.envelope.intoto.json").rename(job / "result.intoto.json")
    proc = run_cli("verify-result", str(job), "--json", env={"RUNNER_CONFIG_DIR": str(config)})
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert [s["predicateType"] for s in info["statements"]] == [attest.ENVELOPE_PREDICATE_TYPE]
    assert info["measurements"] == {"toy-accuracy": 0.819}
    assert any("before SLSA provenance" in n for n in info["notes"])


def test_a_regraded_result_is_signed_anew(job: Path, config: Path) -> None:
    """`runner parse` writes revision 2 and signs both statements again: the provenance names
    the new result.json and the re-grade, and it verifies as before."""
    from runner.app.regrade import regrade

    regrade(job, latest=False, max_bytes=2**30, result_key=config / "runner-key" / "runner.key")
    proc = run_cli("verify-result", str(job), "--json", env={"RUNNER_CONFIG_DIR": str(config)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["measurements"] == {"toy-accuracy": 0.819}
    prov = _payload(job / attest.STATEMENT_FILE)["predicate"]
    assert prov["runDetails"]["metadata"]["invocationId"].endswith("/attempt-1/revision-2")
    assert prov["buildDefinition"]["internalParameters"]["regrade"]["parserVersions"] == "recorded"
    _validate_provenance(prov)
