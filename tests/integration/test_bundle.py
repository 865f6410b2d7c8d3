"""`runner export` and `runner verify-bundle`: a run as one BagIt archive that anyone can
verify offline, with no engine and no docker SDK; one changed byte anywhere fails it, naming
the file.

The tests that need no engine are in tests/unit/test_bundle.py."""

from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import json_measurement, run_cli, run_job, session_containers, write_contract
from tests.unit.test_bundle import (
    _verify,
)


@dataclass(frozen=True)
class Signed:
    """A job run from a signed contract, and the keys an auditor would be handed."""

    job: Path
    issuer_pub: Path
    trusted: Path
    """The host's trusted issuer keys folder (holds issuer_pub)."""


def _runner_pub() -> Path:
    return Path(os.environ["RUNNER_CONFIG_DIR"]) / "runner-key" / "runner.pub"


def _signed_run(folder: Path, contract: Path) -> Signed:
    keys = folder / "trusted"
    assert run_cli("keygen", "--out", str(folder / "issuer")).returncode == 0
    assert run_cli("trust", str(folder / "issuer.pub"), "--trusted-keys", str(keys)).returncode == 0
    signed = run_cli("sign", str(contract), "--key", str(folder / "issuer.key"), "--json")
    assert signed.returncode == 0, signed.stderr
    envelope = Path(json.loads(signed.stdout)["envelope"])
    code, env, stderr = run_job(
        envelope, folder / "state", "--trusted-keys", str(keys), unsigned=False
    )
    assert code == 0 and env["signature"]["status"] == "verified", stderr
    return Signed(Path(env["jobDir"]), folder / "issuer.pub", keys)


def _export(job: Path, out: Path, *extra: str, signed: Signed | None = None) -> dict[str, Any]:
    """`runner export --json`; for a signed run, on a host trusting its issuer."""
    keys = ["--trusted-keys", str(signed.trusted)] if signed else []
    proc = run_cli("export", str(job), "-o", str(out), "--json", *keys, *extra)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def _keys(signed: Signed) -> list[str]:
    return ["--key", str(_runner_pub()), "--issuer-key", str(signed.issuer_pub)]


def _member(archive: Path, rel: str) -> tarfile.TarInfo:
    with tarfile.open(archive) as tar:
        (found,) = [m for m in tar.getmembers() if m.name.split("/", 1)[1:] == [rel]]
        return found


def _flip(archive: Path, rel: str, out: Path) -> Path:
    """A copy of the plain tar ``archive`` with one byte of ``rel``'s content changed."""
    member = _member(archive, rel)
    data = bytearray(archive.read_bytes())
    data[member.offset_data + member.size // 2] ^= 0x01
    out.write_bytes(bytes(data))
    return out


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory, image_id: str) -> Signed:
    """The toy evaluation, signed, run once for the module."""
    folder = tmp_path_factory.mktemp("bundle-toy")
    return _signed_run(folder, write_contract(folder, image_id))


@pytest.fixture(scope="module")
def toy_tar(toy: Signed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    archive = tmp_path_factory.mktemp("bundle-tar") / "toy.tar"
    _export(toy.job, archive, signed=toy)
    return archive


@pytest.mark.docker
def test_export_then_verify_passes(toy: Signed, tmp_path: Path) -> None:
    """The default .tar.gz verifies on the host that made it (its own runner key and trusted
    issuer keys), re-parses the toy's 0.819, and is a bag any BagIt tool validates."""
    archive = tmp_path / "toy.bag.tar.gz"
    made = _export(toy.job, archive, signed=toy)
    assert made["beside"] == [] and made["skipped"] == [] and made["blobs"] is None
    with tarfile.open(archive) as tar:
        names = {m.name for m in tar.getmembers()}
    for rel in (
        "bagit.txt", "bag-info.txt", "manifest-sha256.txt", "tagmanifest-sha256.txt",
        "bundle.intoto.json", "runner-bundle.json", "data/result.json",
        "data/result.intoto.json", "data/result.envelope.intoto.json",
        "data/input/task.json", "data/input/task.dsse.json",
        "data/execution/input-manifest.json", "data/record/ledger.jsonl",
        "data/output/logs/evaluation.log", "data/output/logs/evaluation.err",
    ):  # fmt: skip
        assert f"toy.bag/{rel}" in names, rel
    assert not any("/data/input/repository" in n or "/record/lock" in n for n in names)

    code, report = _verify(archive, env={"RUNNER_TRUSTED_KEYS": str(toy.trusted)})
    assert code == 0, report["problems"]
    assert report["valid"] and report["measurements"] == {"toy-accuracy": 0.819}
    checks = {c["check"]: c for c in report["checks"]}
    assert all(c["status"] == "ok" for c in checks.values()), checks
    assert "this host's runner key" in checks["seal"]["detail"]
    assert "this host's trusted issuer key" in checks["contract"]["detail"]

    people = run_cli("verify-bundle", str(archive), env={"RUNNER_TRUSTED_KEYS": str(toy.trusted)})
    assert people.returncode == 0 and people.stdout.startswith(f"ok: {archive} verifies")

    import bagit

    tar_dir = tmp_path / "unpacked"
    with tarfile.open(archive) as tar:
        tar.extractall(tar_dir, filter="data")
    assert bagit.Bag(str(tar_dir / "toy.bag")).validate()

    # --with-inputs bundles the staged inputs, checked against the input manifest.
    full = tmp_path / "full.tar"
    _export(toy.job, full, "--with-inputs", signed=toy)
    code, report = _verify(full, *_keys(toy))
    assert code == 0, report["problems"]
    inputs = {c["check"]: c["detail"] for c in report["checks"]}["inputs"]
    staged = json.loads((toy.job / "execution" / "input-manifest.json").read_text())["files"]
    assert inputs.startswith(f"{len(staged)} of {len(staged)} input files"), inputs


NO_DOCKER = (
    "import sys\n"
    "sys.modules['docker'] = None  # any `import docker` now raises ImportError\n"
    "from runner.cli import dispatch\n"
    "code = dispatch(sys.argv[1:])\n"
    "loaded = [m for m, v in sys.modules.items() if v is not None\n"
    "          and (m.split('.')[0] == 'docker' or m == 'runner.backends.docker')]\n"
    "assert not loaded, loaded\n"
    "sys.exit(code)\n"
)


@pytest.mark.docker
def test_verify_needs_no_engine_and_no_docker_sdk(
    toy: Signed, toy_tar: Path, tmp_path: Path
) -> None:
    """On an auditor's machine (another config folder, no engine, docker unimportable): with
    the keys handed over it verifies; with none it checks everything else and reports the
    signatures UNVERIFIED (exit 3, or 0 with --allow-untrusted)."""
    auditor = tmp_path / "auditor"
    auditor.mkdir()
    env = {
        **os.environ,
        "RUNNER_CONFIG_DIR": str(auditor),
        "DOCKER_HOST": "unix:///nonexistent/docker.sock",
        "PATH": "/nonexistent",
    }

    def audit(*args: str) -> tuple[int, dict[str, Any]]:
        proc = subprocess.run(
            [sys.executable, "-c", NO_DOCKER, "verify-bundle", str(toy_tar), "--json", *args],
            capture_output=True, text=True, env=env, check=False, timeout=120,
        )  # fmt: skip
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc.returncode, json.loads(proc.stdout)

    code, report = audit(*_keys(toy))
    assert code == 0, report["problems"]
    assert report["measurements"] == {"toy-accuracy": 0.819}

    code, report = audit()
    assert code == 3 and report["category"] == "signature_invalid"
    assert report["firstProblem"]["file"] == "bundle.intoto.json"
    assert "UNVERIFIED" in report["firstProblem"]["message"]
    status = {c["check"]: c["status"] for c in report["checks"]}
    assert status["seal"] == status["contract"] == status["statement"] == "unverified", status
    assert all(status[c] == "ok" for c in ("tag files", "payload", "ledger", "measurements"))

    code, report = audit("--allow-untrusted")
    assert code == 0 and report["valid"]
    # The seal, the contract and the two result statements.
    assert len(report["warnings"]) == 4 and all("UNVERIFIED" in w for w in report["warnings"])


TARGETS = [
    "data/result.json",
    "data/record/ledger.jsonl",
    "data/output/logs/evaluation.log",
    "data/result.intoto.json",
    "data/input/task.json",
    "data/input/task.dsse.json",
    "data/execution/input-manifest.json",
    "bag-info.txt",
    "manifest-sha256.txt",
    "runner-bundle.json",
    "tagmanifest-sha256.txt",
    "bundle.intoto.json",
]


@pytest.mark.docker
@pytest.mark.parametrize("target", TARGETS)
def test_one_changed_byte_fails_naming_the_file(
    toy: Signed, toy_tar: Path, tmp_path: Path, target: str
) -> None:
    assert _verify(toy_tar, *_keys(toy))[0] == 0
    bad = _flip(toy_tar, target, tmp_path / "bad.tar")
    code, report = _verify(bad, *_keys(toy))
    assert code == 3 and not report["valid"]
    assert report["firstProblem"]["file"] == target, report["problems"]
    if target == TARGETS[0]:
        people = run_cli("verify-bundle", str(bad), *_keys(toy))
        assert people.returncode == 3
        assert people.stdout.startswith(f"FAILED: {bad} does not verify: {target}: sha256 is")


@pytest.mark.docker
def test_a_changed_byte_in_a_compressed_bundle(toy: Signed, tmp_path: Path) -> None:
    """In a .tar.gz: a file changed inside names the file; a byte of the gzip stream itself
    changed names the archive."""
    archive = tmp_path / "toy.tar.gz"
    _export(toy.job, archive, signed=toy)
    raw = bytearray(gzip.decompress(archive.read_bytes()))
    plain = tmp_path / "plain.tar"
    plain.write_bytes(bytes(raw))
    member = _member(plain, "data/output/logs/evaluation.log")
    raw[member.offset_data + 3] ^= 0x01
    inside = tmp_path / "inside.tar.gz"
    inside.write_bytes(gzip.compress(bytes(raw)))
    code, report = _verify(inside, *_keys(toy))
    assert code == 3 and report["firstProblem"]["file"] == "data/output/logs/evaluation.log"

    stream = bytearray(archive.read_bytes())
    stream[-6] ^= 0x01  # the gzip trailer's CRC-32: every file's content is intact
    damaged = tmp_path / "damaged.tar.gz"
    damaged.write_bytes(bytes(stream))
    code, report = _verify(damaged, *_keys(toy))
    assert code == 3 and report["problems"] == [
        {"file": "damaged.tar.gz", "message": report["problems"][0]["message"],
         "category": "bundle_invalid"}
    ]  # fmt: skip
    assert "is damaged" in report["firstProblem"]["message"]

    # In a plain tar, bytes that belong to no file: a member's padding, the end.
    plain = tmp_path / "toy.tar"
    _export(toy.job, plain)
    member = _member(plain, "data/output/logs/evaluation.log")
    raw = bytearray(plain.read_bytes())
    raw[member.offset_data + member.size + 1] ^= 0x01
    padded = tmp_path / "padded.tar"
    padded.write_bytes(bytes(raw))
    code, report = _verify(padded, *_keys(toy))
    assert code == 3 and report["firstProblem"]["file"] == "data/output/logs/evaluation.log"
    assert "padding" in report["firstProblem"]["message"]
    raw = bytearray(plain.read_bytes())
    raw[-1] ^= 0x01
    ended = tmp_path / "ended.tar"
    ended.write_bytes(bytes(raw))
    code, report = _verify(ended, *_keys(toy))
    assert code == 3 and report["firstProblem"]["file"] == "ended.tar"


BIG = r"""
import json, os
with open('/job/output/big.json', 'w') as f:
    json.dump({'accuracy': 0.75, 'pad': ['x' * 1000] * 3200}, f)
os.symlink('/etc/passwd', '/job/output/stolen.txt')
json.dump({'schemaVersion': '2.0', 'status': 'completed', 'summary': 'big evidence',
           'limitations': [], 'evidence': [{'path': 'big.json'}],
           'outputs': [{'path': 'stolen.txt'}]}, open('/job/output/result.json', 'w'))
"""


@pytest.mark.docker
def test_large_output_beside_and_links_never_followed(tmp_path: Path, image_id: str) -> None:
    """A 3 MiB evidence file over --inline-max-mb 1 is stored beside the archive by digest and
    re-parsed from there; deleted or changed, it fails naming it. Links (one the job planted
    in output/, one in record/) are left out and listed, never followed."""
    contract = write_contract(
        tmp_path,
        image_id,
        command=["python3", "-c", BIG],
        measurements=[json_measurement("big.json")],
    )
    signed = _signed_run(tmp_path, contract)
    os.symlink("/etc/passwd", signed.job / "record" / "passwd")
    os.mkfifo(signed.job / "record" / "fifo")
    archive = tmp_path / "big.tar"
    made = _export(signed.job, archive, "--inline-max-mb", "1", signed=signed)

    (beside,) = made["beside"]
    assert beside["path"] == "data/output/big.json" and beside["size"] > 3 * 1024 * 1024
    blob = Path(made["blobs"]) / "sha256" / beside["sha256"]
    assert blob.is_file() and Path(made["blobs"]) == tmp_path / "big.tar.blobs"
    skipped = {s["path"]: s["why"] for s in made["skipped"]}
    assert "symbolic link" in skipped["output/stolen.txt"]
    assert "symbolic link" in skipped["record/passwd"]
    assert "FIFO" in skipped["record/fifo"]
    with tarfile.open(archive) as tar:
        names = [m.name for m in tar.getmembers()]
    assert not any(n.endswith(("big.json", "stolen.txt", "/passwd", "/fifo")) for n in names)
    passwd_line = Path("/etc/passwd").read_bytes().splitlines()[0]
    assert passwd_line not in archive.read_bytes()
    with tarfile.open(archive) as tar:
        fetch = tar.extractfile("big/fetch.txt")
        assert fetch is not None
        line = fetch.read().decode()
    assert line == f"file:sha256/{beside['sha256']} {beside['size']} {beside['path']}\n"

    keys = ["--key", str(_runner_pub()), "--issuer-key", str(signed.issuer_pub)]
    code, report = _verify(archive, *keys)
    assert code == 0, report["problems"]
    assert report["beside"] == ["data/output/big.json"]
    assert report["measurements"] == {"m": 0.75}
    assert {s["path"] for s in report["skipped"]} == set(skipped)

    # The bag completed from fetch.txt is valid for any BagIt tool.
    import bagit

    unpacked = tmp_path / "unpacked"
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
    shutil.copy(blob, unpacked / "big" / "data" / "output" / "big.json")
    assert bagit.Bag(str(unpacked / "big")).validate()

    # Elsewhere, with --blobs.
    moved = tmp_path / "elsewhere"
    shutil.copytree(made["blobs"], moved)
    changed = bytearray(blob.read_bytes())
    changed[len(changed) // 2] ^= 0x01  # same size, one byte changed
    blob.write_bytes(bytes(changed))
    code, report = _verify(archive, *keys)
    assert code == 3 and report["firstProblem"]["file"] == "data/output/big.json"
    assert "whose sha256 is" in report["firstProblem"]["message"]
    assert _verify(archive, *keys, "--blobs", str(moved))[0] == 0

    blob.unlink()
    code, report = _verify(archive, *keys)
    assert code == 3 and report["firstProblem"]["file"] == "data/output/big.json"
    assert "absent" in report["firstProblem"]["message"]
    assert session_containers() == []


@pytest.mark.docker
def test_values_are_re_parsed_not_taken_from_the_envelope(
    toy: Signed, toy_tar: Path, tmp_path: Path
) -> None:
    """A bundle re-made with a changed value, every signature and hash made anew with the
    runner's own key, still fails: the evidence re-parses to 0.819, not 0.9."""
    import bagit

    from runner.models.envelope import ResultEnvelope
    from runner.results import attest
    from runner.results.bundle.export import seal
    from runner.trust import signing

    work = tmp_path / "work"
    with tarfile.open(toy_tar) as tar:
        tar.extractall(work, filter="data")
    bag = work / "toy"
    envelope = bag / "data" / "result.json"
    envelope.write_text(envelope.read_text().replace('"value": 0.819', '"value": 0.9'))
    key = _runner_pub().with_suffix(".key")
    before = json.loads(
        base64.b64decode(json.loads((bag / "data" / "result.intoto.json").read_text())["payload"])
    )
    # Both statements signed anew, as the runner signs them, over the changed envelope.
    attest.sign_result(ResultEnvelope.model_validate_json(envelope.read_text()), bag / "data", key)
    after = json.loads(
        base64.b64decode(json.loads((bag / "data" / "result.intoto.json").read_text())["payload"])
    )
    assert after["subject"][0] != before["subject"][0]  # result.json's new digest
    private = signing.load_private_key(key)
    (bag / "bundle.intoto.json").unlink()
    bagit.Bag(str(bag)).save(manifests=True)
    seal(bag, private, "forged")
    forged = tmp_path / "forged.tar"
    with tarfile.open(forged, "w") as tar:
        tar.add(bag, arcname="forged")
    code, report = _verify(forged, *_keys(toy))
    assert code == 3
    problems = {p["file"]: p["message"] for p in report["problems"]}
    assert "re-parses with json.scalar@1 to 0.819" in problems["data/output/logs/evaluation.log"]
    assert "toy-accuracy = 0.9" in problems["data/output/logs/evaluation.log"]
    status = {c["check"]: c["status"] for c in report["checks"]}
    assert status["seal"] == status["payload"] == status["statement"] == "ok"


@pytest.mark.docker
def test_a_regraded_job_verifies(toy: Signed, tmp_path: Path) -> None:
    """After `runner parse`, the envelope is revision 2 and the ledger's job.finished names
    revision 1, bundled under record/; a revision the ledger does not name fails."""
    job = tmp_path / "job"
    shutil.copytree(toy.job, job, symlinks=True)
    assert run_cli("parse", str(job)).returncode == 0
    archive = tmp_path / "regraded.tar"
    _export(job, archive, signed=toy)
    code, report = _verify(archive, *_keys(toy))
    assert code == 0, report["problems"]
    files = {c["check"]: c["detail"] for c in report["checks"]}["files"]
    assert files.endswith("the ledger names the revision it re-grades (in data/record/)")

    (earlier,) = (job / "record").glob("result-*.json")
    earlier.unlink()
    _export(job, archive, "--force", signed=toy)
    code, report = _verify(archive, *_keys(toy))
    assert code == 3 and report["firstProblem"]["file"] == "data/record/ledger.jsonl"
    assert "no earlier revision" in report["firstProblem"]["message"]


@pytest.mark.docker
def test_export_refuses_what_would_not_verify(toy: Signed, tmp_path: Path) -> None:
    """Evidence changed since the run stops the export (nothing written); an existing archive
    is not replaced without --force; a job with no result has nothing to export."""
    job = tmp_path / "job"
    shutil.copytree(toy.job, job, symlinks=True)
    (job / "record" / "lock").unlink()
    log = job / "output" / "logs" / "evaluation.log"
    log.write_text(log.read_text().replace("0.819", "0.999"))
    proc = run_cli("export", str(job), "-o", str(tmp_path / "x.tar"))
    assert proc.returncode == 3 and "output/logs/evaluation.log now hashes to" in proc.stderr
    assert list(tmp_path.glob("x.tar*")) == [] and list(tmp_path.glob(".x.tar*")) == []

    (tmp_path / "there.tar").write_bytes(b"")
    proc = run_cli("export", str(toy.job), "-o", str(tmp_path / "there.tar"))
    assert proc.returncode == 2 and "--force" in proc.stderr

    (job / "result.json").unlink()
    proc = run_cli("export", str(job), "-o", str(tmp_path / "y.tar"))
    assert proc.returncode == 3 and "bundle_invalid" in proc.stderr
