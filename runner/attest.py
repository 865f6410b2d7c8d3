"""A result anyone can verify: the envelope as a signed in-toto Statement.

After writing ``result.json``, the runner signs an in-toto Statement v1 in a DSSE envelope
(``result.intoto.json`` beside it). Its subjects are the files the result rests on (evidence,
logs, the agent's result and the files it lists), each named ``output/<path>`` with its
SHA-256; its predicate is the envelope itself (contract digest, image digests, parser
versions, budget, exit). The key is the runner's own Ed25519 key, made on first use.

``runner verify-result FILE [--output-dir DIR]`` checks the signature against trusted runner
keys and, given the output folder, every subject's hash.
"""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner import signing
from runner.envelope import ResultEnvelope
from runner.errors import SignatureInvalid

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://github.com/citeark/runner/result-envelope/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_FILE = "result.intoto.json"


def runner_key(path: Path) -> Path:
    """The runner's private key at ``path`` (``.key``), made with its ``.pub`` on first use."""
    if not path.exists():
        # Another runner may make it at the same moment: its key is as good as ours.
        with contextlib.suppress(FileExistsError):
            signing.generate_key(path, path.with_suffix(".pub"))
    return path


def _subjects(envelope: ResultEnvelope) -> list[dict[str, Any]]:
    seen: dict[str, str] = {}
    for m in envelope.measurements:
        seen[m.evidence.path] = m.evidence.sha256
    refs = list(envelope.logs)
    if envelope.agentResult is not None:
        refs += [envelope.agentResult.file, *envelope.agentResult.listed]
    for ref in refs:
        if ref.exists and ref.sha256:
            seen[ref.path] = ref.sha256
    return [
        {"name": f"output/{path}", "digest": {"sha256": digest.removeprefix("sha256:")}}
        for path, digest in sorted(seen.items())
    ]


def statement(envelope: ResultEnvelope) -> dict[str, Any]:
    return {
        "_type": STATEMENT_TYPE,
        "subject": _subjects(envelope),
        "predicateType": PREDICATE_TYPE,
        "predicate": envelope.model_dump(mode="json"),
    }


def sign_result(envelope: ResultEnvelope, job_root: Path, key_path: Path) -> Path:
    """Write ``<job>/result.intoto.json``; return its path."""
    private = signing.load_private_key(runner_key(key_path))
    payload = json.dumps(statement(envelope), sort_keys=True, separators=(",", ":")).encode()
    dsse = signing.sign(payload, private, payload_type=PAYLOAD_TYPE)
    out = job_root / STATEMENT_FILE
    from runner.staging import atomic_write

    atomic_write(out, signing.dumps_envelope(dsse).encode())
    return out


@dataclass(frozen=True)
class Verified:
    statement: dict[str, Any]
    keyids: tuple[str, ...]
    checked: int
    """Subjects whose hash was checked against the output folder."""


def verify_result(
    path: Path, trusted: list[signing.TrustedKey], output_dir: Path | None
) -> Verified:
    """Check the signature (and, given ``output_dir``, every subject); raise on any mismatch."""
    from runner.safefs import UnsafePath
    from runner.staging import sha256_under

    try:
        envelope = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise SignatureInvalid(f"{path} is not a readable signed result: {exc}") from exc
    if not isinstance(envelope, dict):
        raise SignatureInvalid(f"{path} is not a DSSE envelope")
    verified = signing.verify_envelope(envelope, trusted, 1, payload_type=PAYLOAD_TYPE)
    try:
        stmt = json.loads(verified.payload)
    except ValueError as exc:
        raise SignatureInvalid(f"{path}: the signed payload is not JSON") from exc
    if stmt.get("_type") != STATEMENT_TYPE or stmt.get("predicateType") != PREDICATE_TYPE:
        raise SignatureInvalid(f"{path} is not a runner result statement")
    checked = 0
    if output_dir is not None:
        bad = []
        for subject in stmt.get("subject", []):
            rel = str(subject["name"]).removeprefix("output/")
            try:
                digest, _ = sha256_under(output_dir, rel, sys.maxsize)
            except UnsafePath as exc:
                bad.append(f"{rel}: {exc.problem}")
                continue
            if digest != subject["digest"]["sha256"]:
                bad.append(f"{rel}: sha256 {digest} is not the signed one")
            checked += 1
        if bad:
            raise SignatureInvalid(
                "the output folder does not match the signed result: " + "; ".join(bad),
                hint="the evidence was changed after the run; the signed values no longer "
                "rest on these files",
            )
    return Verified(stmt, verified.keyids, checked)
